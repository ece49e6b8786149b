"""`python -m efpsn` is the `efpsn` console script."""

import sys

from efpsn.cli.main import main

sys.exit(main())
