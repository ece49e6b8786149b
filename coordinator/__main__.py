"""`python -m coordinator ...`: the same as `efpsn coordinator ...`."""

import sys

from coordinator.cli import build_parser
from efpsn.flags.parser import run_command

if __name__ == "__main__":
    sys.exit(run_command(build_parser(), sys.argv[1:], numeric=False))
