import sys

from metricbus.cli import main

sys.exit(main())
