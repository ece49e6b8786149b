"""`efpsn report`: the picture of a run, from the histories its agents left (curves, picture)."""
