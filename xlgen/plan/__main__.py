"""`python -m xlgen.plan` = `xlgen plan`."""

import sys

from xlgen.plan.cli import main

if __name__ == "__main__":
    sys.exit(main())
