"""What a run protects: Theorem 4.1, the accountant of refreshed masks, and the one-line statement
of each mode."""
