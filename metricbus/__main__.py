import sys

from metricbus._cli import main

sys.exit(main())
