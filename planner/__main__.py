"""`python -m planner ...`: the same command line as the `planner` console script."""

import sys

from planner.cli.app import main

sys.exit(main())
