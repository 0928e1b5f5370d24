"""Child processes that die with their parent (Linux PR_SET_PDEATHSIG) and stop in bounded time.

A child of ``metricbus up`` writes its output through a :class:`LogPump` of ours: its log file
while the disk takes it, and its last lines in memory always, so a full data disk loses no
child's errors: they are shown on up's terminal until the disk has room again.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1
#: the supervisor's pid, in the environment of each child :func:`spawn` starts
SUPERVISOR_ENV = "METRICBUS_SUPERVISOR_PID"
#: how long a child whose supervisor died may take to stop, as :func:`stop` allows it
ORPHAN_GRACE_S = 5.0


def _die_with(parent: int) -> Callable[[], None]:
    """What a child runs before exec: SIGTERM when ``parent`` dies, also if it already has.

    A parent killed between the fork and the ``prctl`` sends no signal (the child already has
    another parent): a dashboard started as ``up`` was killed outlived it.
    """

    def arm() -> None:
        if sys.platform.startswith("linux"):
            libc = ctypes.CDLL("libc.so.6", use_errno=True)
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent:
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def exit_when_orphaned(env: Mapping[str, str] = os.environ) -> None:
    """In a child of ``metricbus up``: exit at most ORPHAN_GRACE_S after its supervisor died.

    PDEATHSIG asks the child to stop (SIGTERM), and a supervisor that stops children itself
    kills one that takes longer than :func:`stop` allows; a supervisor killed -9 can do neither.
    A child that cannot act on the signal then (the stream worker while Faust starts: seen
    alive 10 s after) would outlive its stack. Only the direct child of the pid in
    SUPERVISOR_ENV watches (a process it starts in turn inherits the variable).
    """
    parent = env.get(SUPERVISOR_ENV, "")
    if not parent.isdigit() or os.getppid() != int(parent):
        return

    def watch() -> None:
        while os.getppid() == int(parent):
            time.sleep(1.0)
        time.sleep(ORPHAN_GRACE_S)
        os._exit(1)

    threading.Thread(target=watch, name="metricbus-orphan-watch", daemon=True).start()


class LogPump:
    """Copies a child's output to its log file, line by line, keeping the last lines in memory.

    When the file cannot be written (a full disk), ``report`` is told once, with the reason,
    and then every line that reads as an error, until a write succeeds again (told too). A
    consumer whose destination refuses (its flushes fail: a full disk; or it takes nothing) is
    told on ``report`` too while its log is written: its first such line, then one a minute,
    and the line that says it writes again.
    """

    KEPT = 200  #: lines kept in memory, whatever the disk does
    #: what a consumer's log says when its destination refuses, and when it takes again
    REFUSED = ("flush failed", "nothing committed past it")
    TAKES_AGAIN = "writes again"
    REFUSED_EVERY_S = 60.0

    def __init__(self, name: str, path: Path, stream: IO[bytes], report: Callable[[str], None]) -> None:
        self.name, self.path, self.stream, self.report = name, path, stream, report
        self.kept: collections.deque[bytes] = collections.deque(maxlen=self.KEPT)
        self.failing = False
        self._refused_at: float | None = None  #: when a refusal was last told (None: none since it took)
        self._file: IO[bytes] | None = None
        self._thread = threading.Thread(target=self._run, name=f"log-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        for line in iter(self.stream.readline, b""):
            self.kept.append(line)
            try:
                if self._file is None:
                    self._file = open(self.path, "ab")  # noqa: SIM115 - kept open between lines
                self._file.write(line)
                self._file.flush()
            except OSError as exc:
                self._refused(line, exc)
                continue
            if self.failing:
                self.failing = False
                self.report(f"metricbus up: {self.name}: its log {self.path} is written again")
            self._destination(line)
        self._close()

    def _destination(self, line: bytes) -> None:
        """Tell ``report`` of a refusing destination (rate-limited), and of its taking again."""
        if self.TAKES_AGAIN.encode() in line and self._refused_at is not None:
            self._refused_at = None
        elif any(word.encode() in line for word in self.REFUSED):
            now = time.monotonic()
            if self._refused_at is not None and now - self._refused_at < self.REFUSED_EVERY_S:
                return
            self._refused_at = now
        else:
            return
        text = line.decode("utf-8", "replace").rstrip()
        self.report(f"metricbus up: {self.name}: {text[:500]}")

    def _refused(self, line: bytes, exc: OSError) -> None:
        self._close()  # its buffer may hold what the disk refused: dropped, reopened next line
        if not self.failing:
            self.failing = True
            self.report(
                f"metricbus up: {self.name}: cannot write its log {self.path} ({exc.strerror or exc}); "
                f"its last {self.KEPT} lines are kept in memory and its errors shown here until "
                "the disk has room"
            )
        text = line.decode("utf-8", "replace").rstrip()
        if any(word in text for word in ("ERROR", "CRITICAL", "Traceback", "Error:")):
            self.report(f"metricbus up: {self.name}: {text[:500]}")

    def _close(self) -> None:
        if self._file is not None:
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None

    def tail(self, lines: int = 12) -> str:
        """The child's last ``lines`` lines, from memory (the file may have refused them)."""
        kept = list(self.kept)[-lines:]
        return "\n".join(line.decode("utf-8", "replace").rstrip() for line in kept)

    def join(self, timeout: float = 2.0) -> None:
        """Wait for the child's last output (after it exited)."""
        self._thread.join(timeout)


class Pumped(subprocess.Popen[bytes]):
    """A child whose output goes through its :class:`LogPump`."""

    log_pump: LogPump


def spawn(
    argv: Sequence[str],
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    report: Callable[[str], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv``; its output goes to ``log_path`` (or is inherited); it gets SIGTERM if we die.

    With ``report``, the output goes through a :class:`LogPump` (``proc.log_pump``), which says
    on ``report`` when the log cannot be written. The child runs in a session of its own, so a
    Ctrl-C at the terminal (SIGINT to the whole foreground process group) reaches only us: we
    stop children in the order they need.
    """
    env = {**(os.environ if env is None else env), SUPERVISOR_ENV: str(os.getpid())}
    if log_path is not None and report is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        proc = Pumped(
            list(argv),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            preexec_fn=_die_with(os.getpid()),  # noqa: PLW1509 - no threads exist in the child yet
            start_new_session=True,
        )
        assert proc.stdout is not None
        proc.log_pump = LogPump(Path(log_path).stem, log_path, proc.stdout, report)
        return proc
    out: IO[Any] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        out = open(log_path, "ab")  # noqa: SIM115 - the child owns the handle once started
    try:
        return subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT if out else None,
            env=env,
            preexec_fn=_die_with(os.getpid()),  # noqa: PLW1509 - no threads exist in the child yet
            start_new_session=True,
        )
    finally:
        if out is not None:
            out.close()


def stop(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> int | None:
    """SIGTERM, wait up to ``timeout``, then SIGKILL; return the exit code. Idempotent."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(2.0)
    return proc.returncode


def tail(path: Path, lines: int = 12, proc: subprocess.Popen[bytes] | None = None) -> str:
    """The last ``lines`` lines of a child's output: its pump's when it has one, else its log file's."""
    if isinstance(proc, Pumped):
        proc.log_pump.join()
        return proc.log_pump.tail(lines)
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
