"""Every test process (each xdist worker too) gets a runtime dir of its own for stack files.

Without it a test that starts `metricbus up` would announce its stack where a developer's own
stack is announced, and a test's client with no broker given would join whichever is newest.
"""

import os
import tempfile

os.environ["METRICBUS_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="metricbus-stacks-")
