import sys

from dsv4bench.cli import main

sys.exit(main())
