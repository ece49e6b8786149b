"""`efpsn up`: a coordinator and n agents as separate local processes, watched to the end.

processes.py starts, waits for and stops the services' processes; network.py plans and runs the
local network; failures.py turns the agents' structured failure records into the root cause;
summary.py makes the network's summary of the agents' results; placement.py shares the
launcher's CPUs out among the agents; signals.py turns SIGTERM, SIGHUP
and SIGINT into an orderly stop of everything started (efpsn/process/lifeline.py stops it all when
the launcher is killed -9); the command line is efpsn/cli/up.py.
It starts the services as processes (`python -m coordinator`, `python -m agent`) and never
imports them.
"""
