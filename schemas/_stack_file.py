"""Finding the local stack: ``metricbus up`` says where it is, every client reads it.

``up`` writes ``<runtime dir>/<pid>.json`` (the broker's address, the data directory, the topic
prefix, the dashboard's URL, its pid and start time) once its broker is up, and removes it when
it stops. A client given no broker address (no ``--bootstrap`` nor ``METRICBUS_BOOTSTRAP`` /
``METRICBUS_LOCAL_PORT``) joins the newest running stack, taking its data directory and prefix
unless those are given too: arguments > environment > the running stack > defaults. A file
whose process is gone (a killed ``up``, or a pid reused since) is ignored, said once, and
removed. The runtime dir is ``~/.metricbus/stacks``, or ``METRICBUS_RUNTIME_DIR``.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from typing import Any

from ._files import atomic_write

log = logging.getLogger("metricbus")

RUNTIME_DIR_ENV = "METRICBUS_RUNTIME_DIR"


def runtime_dir() -> Path:
    """Where running stacks announce themselves."""
    return Path(os.environ.get(RUNTIME_DIR_ENV) or Path.home() / ".metricbus" / "stacks")


@dataclasses.dataclass(frozen=True)
class StackInfo:
    """Where one running ``metricbus up`` is."""

    pid: int
    #: the process's start time (psutil's create_time): a pid reused by another process differs
    created: float
    data_dir: str
    topic_prefix: str
    #: a real cluster's bootstrap servers, or None for the embedded broker on ``local_port``
    bootstrap: str | None = None
    local_port: int | None = None
    dashboard_url: str | None = None

    @property
    def address(self) -> str:
        """The broker's bootstrap address."""
        return self.bootstrap or f"127.0.0.1:{self.local_port}"

    def describe(self) -> str:
        """One line: which stack this is."""
        return f"the stack of `metricbus up` (pid {self.pid}) at {self.address}, data in {self.data_dir}"


def _created(pid: int) -> float | None:
    """The start time of process ``pid``; None when there is none."""
    import psutil

    try:
        return float(psutil.Process(pid).create_time())
    except (psutil.Error, OSError, ValueError):
        return None


def announce(info: StackInfo) -> Path:
    """Write the stack's file (atomically); return its path."""
    path = runtime_dir() / f"{info.pid}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(dataclasses.asdict(info), sort_keys=True).encode())
    return path


def this_process(**fields: Any) -> StackInfo:
    """A StackInfo of the calling process (``metricbus up``)."""
    pid = os.getpid()
    return StackInfo(pid=pid, created=_created(pid) or 0.0, **fields)


def withdraw(pid: int | None = None) -> None:
    """Remove the file of the stack of ``pid`` (this process by default); missing is fine."""
    try:
        (runtime_dir() / f"{pid or os.getpid()}.json").unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("metricbus: could not remove the stack file of pid %s (%s)", pid, exc)


def running_stack(data_dir: Path | str | None = None) -> StackInfo | None:
    """The newest running stack on this machine (of ``data_dir`` when given); None when there is none.

    Files of stacks that are gone are removed, each said once in the log; unreadable ones are
    skipped with a line naming them.
    """
    directory = runtime_dir()
    try:
        paths = sorted(directory.glob("*.json"))
    except OSError:
        return None
    alive: list[StackInfo] = []
    for path in paths:
        try:
            raw = json.loads(path.read_text())
            info = StackInfo(**{f.name: raw[f.name] for f in dataclasses.fields(StackInfo) if f.name in raw})
            names_broker = bool(info.bootstrap) and isinstance(info.bootstrap, str)
            if not names_broker and not isinstance(info.local_port, int):
                raise ValueError("it names no broker (bootstrap nor local_port)")
        except (OSError, ValueError, TypeError, KeyError) as exc:
            log.warning("metricbus: ignoring the stack file %s: unreadable (%s)", path, exc)
            continue
        created = _created(int(info.pid))
        if created is None or abs(created - float(info.created)) > 1.0:
            log.warning(
                "metricbus: ignoring %s: the `metricbus up` it names (pid %s) is not running any more",
                path,
                info.pid,
            )
            try:
                path.unlink()
            except OSError:
                pass
            continue
        alive.append(info)
    if data_dir is not None:
        wanted = Path(data_dir).expanduser().resolve()
        alive = [s for s in alive if Path(s.data_dir).expanduser().resolve() == wanted]
    return max(alive, key=lambda s: s.created, default=None)
