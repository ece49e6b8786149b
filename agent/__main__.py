"""`python -m agent ...`: the same as `efpsn agent ...`."""

import sys

from agent.cli import build_parser
from efpsn.cli.common import run_command

if __name__ == "__main__":
    sys.exit(run_command(build_parser(), sys.argv[1:]))
