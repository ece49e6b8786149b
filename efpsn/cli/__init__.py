"""The command line: the `efpsn` console script (main.py) and its commands. The run parameters as
flags and the plumbing every command shares live one floor down, in efpsn/flags/, where the
services' own entry points (agent/cli.py, coordinator/cli.py) use them too.

Nothing below the command line imports from here but the entry points (efpsn/__main__.py) and
the notebook (efpsn/notebook.py), which run a command."""
