"""A child of `metricbus up` that does not act on PDEATHSIG's SIGTERM still ends with its supervisor."""

import subprocess
import sys
import time

import psutil

from metricbus.stack._proc import ORPHAN_GRACE_S

CHILD = """
import signal, time
from metricbus.stack._proc import exit_when_orphaned
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # as a process busy where it cannot stop
exit_when_orphaned()
print("watching", flush=True)
time.sleep(600)
"""

SUPERVISOR = f"""
import sys, time
from metricbus.stack._proc import spawn
child = spawn([sys.executable, "-c", {CHILD!r}])
print(child.pid, flush=True)
time.sleep(600)
"""


def test_a_child_that_ignores_sigterm_exits_within_the_grace_once_its_supervisor_is_killed():
    supervisor = subprocess.Popen([sys.executable, "-c", SUPERVISOR], stdout=subprocess.PIPE, text=True)
    try:
        assert supervisor.stdout is not None
        lines = iter(supervisor.stdout.readline, "")
        child = psutil.Process(int(next(line for line in lines if line.strip().isdigit())))
        assert next(line for line in lines if line.startswith("watching"))  # its watch has started
        assert child.ppid() == supervisor.pid
    finally:
        supervisor.kill()
        supervisor.wait(10)
    killed = time.monotonic()
    gone, alive = psutil.wait_procs([child], timeout=ORPHAN_GRACE_S + 10)
    assert not alive, "the orphan outlived its grace"
    assert time.monotonic() - killed >= ORPHAN_GRACE_S - 1.5  # it had its grace to stop by itself
