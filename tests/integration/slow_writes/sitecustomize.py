"""Slows one instance of each metricbus sink, for tests/integration/test_sink_instances.py.

Python imports this module at the start of every process with this folder on PYTHONPATH and
``METRICBUS_TEST_SLOW_DIR`` set. The first process of each kind of sink (``sink parquet``,
``sink tensorboard``, ``sink wandb``, ``alerts``) to create ``<dir>/<kind>`` is elected (it
writes its pid there) and then takes ``METRICBUS_TEST_SLOW_S`` seconds longer over every write
and every flush of its destination: a destination slower than the group's session timeout.
Every other process is left as it is.
"""

from __future__ import annotations

import os
import sys
import time


def _kind(argv: list[str]) -> str | None:
    if "sink" in argv and argv.index("sink") + 1 < len(argv):
        return argv[argv.index("sink") + 1]
    return "alerts" if "alerts" in argv else None


def _elected(where: str, kind: str) -> bool:
    try:
        fd = os.open(os.path.join(where, kind), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, str(os.getpid()).encode())
    os.close(fd)
    return True


def _say(what: str) -> None:
    """A line as the log's others begin: when (local time, ms), then MARK and what."""
    now = time.time()
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(now)) + f",{int(now * 1000) % 1000:03d}"
    print(f"{when} {MARK} {what}", file=sys.stderr, flush=True)


def _slow_down(seconds: float) -> None:
    from metricbus.sinks._loop import ConsumerLoop
    from metricbus.sinks._runtime import SinkRunner
    from metricbus.sinks.alerts import AlertRunner

    owned_write = ConsumerLoop._owned_write

    async def slow_write(self, prepared_at, write):  # type: ignore[no-untyped-def]
        def slowly():  # type: ignore[no-untyped-def]
            _say("a write begins")
            time.sleep(seconds)
            _say(f"a write took {seconds}s")
            return write()

        return await owned_write(self, prepared_at, slowly)

    ConsumerLoop._owned_write = slow_write  # type: ignore[method-assign]
    for runner in (SinkRunner, AlertRunner):  # their flush runs in a thread, as a destination's
        flush = runner.flush

        def slow_flush(self, flush=flush):  # type: ignore[no-untyped-def]
            time.sleep(seconds)
            flush(self)

        runner.flush = slow_flush  # type: ignore[method-assign]


#: what this module writes to the process's output (its log under `up`)
MARK = "metricbus test: slowed:"

_where = os.environ.get("METRICBUS_TEST_SLOW_DIR")
_what = _kind(sys.argv)
if _where and _what and _elected(_where, _what):
    _say(f"this instance (pid {os.getpid()})")
    _slow_down(float(os.environ.get("METRICBUS_TEST_SLOW_S", "7")))
