"""The command line: the `efpsn` console script (main.py) and its commands, the run parameters as
flags (flags.py), and the plumbing every command shares (common.py, services.py).

Nothing below the command line imports from here; the services' own entry points
(agent/cli.py, coordinator/cli.py) use its flags and plumbing."""
