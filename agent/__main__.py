"""`python -m agent ...`: the same as `efpsn agent ...`."""

import sys

from efpsn.process.runtime import place_from_environment

place_from_environment()  # efpsn up --no-fork's CPUs for it, before any import starts a thread

from agent.cli import build_parser
from efpsn.flags.parser import run_command

if __name__ == "__main__":
    sys.exit(run_command(build_parser(), sys.argv[1:]))
