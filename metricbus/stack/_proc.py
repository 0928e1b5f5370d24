"""Child processes that die with their parent (Linux PR_SET_PDEATHSIG) and stop in bounded time."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    argv: Sequence[str], log_path: Path | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``argv``; its output goes to ``log_path`` (or is inherited); it gets SIGTERM if we die.

    The child runs in a session of its own, so a Ctrl-C at the terminal (SIGINT to the whole
    foreground process group) reaches only us: we stop children in the order they need.
    """
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
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - no threads exist in the child yet
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


def tail(path: Path, lines: int = 12) -> str:
    """The last ``lines`` lines of a log file ("" if there is none)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])
