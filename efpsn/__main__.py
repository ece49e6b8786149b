"""`python -m efpsn` is the `efpsn` console script."""

import sys

from efpsn.cli import main

sys.exit(main())
