"""`efpsn status`: a run's progress gathered from its agents (gather) and shown (lines)."""
