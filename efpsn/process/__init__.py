"""Process-level plumbing of every command: runtime settings, stop signals, and the lifeline to the
launcher."""
