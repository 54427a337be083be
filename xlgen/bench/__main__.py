"""`python -m xlgen.bench` (what `xlgen bench --standard` runs per workload): `xlgen bench` with the command's
host-malloc policy."""

import sys

from xlgen import platforms
from xlgen.bench.cli import main

if __name__ == "__main__":
    platforms.reexec_with_host_malloc()
    sys.exit(main())
