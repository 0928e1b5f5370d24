"""The consumer processes of a stack: each started as a child of ``up``, stopped together.

``Stack`` supervises them (restarts with backoff, refuses one that cannot start) and a
``PlannedRestart`` stops them all around the broker's restart and starts them again; both
through this, neither through the other.
"""

from __future__ import annotations

import dataclasses
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from metricbus.stack import _proc


@dataclasses.dataclass
class Child:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started: float = 0.0
    ever_ran: bool = False  #: it outlived ``startup_s`` once


class Children:
    """The stack's consumer processes, their environment and where their output is reported."""

    def __init__(self, children: list[Child], env: dict[str, str], report: Callable[[str], None]) -> None:
        self.all = children
        self._env = env
        self._report = report

    def __iter__(self) -> Iterator[Child]:
        return iter(self.all)

    def start(self, child: Child) -> None:
        child.proc = _proc.spawn(child.argv, log_path=child.log_path, env=self._env, report=self._report)
        child.started = time.monotonic()

    def start_all(self) -> None:
        for child in self.all:
            self.start(child)

    def stop_all(self, total_s: float | None = None, each_s: float = 30.0) -> None:
        """SIGTERM to all at once (they flush and commit), then wait for each.

        ``total_s`` for them all, or else ``each_s`` for each; one still running then is killed.
        """
        for child in self.all:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()
        deadline = None if total_s is None else time.monotonic() + total_s
        for child in self.all:
            if child.proc is not None:
                wait = each_s if deadline is None else max(0.1, deadline - time.monotonic())
                _proc.stop(child.proc, wait)
                child.proc = None
