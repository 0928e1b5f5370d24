"""Periodic checkpoints of the stream processor, so that a restart replays only what came after.

A checkpoint holds the processor's state and, per partition of the events topic, the offset
after the last record that state includes. The worker takes the snapshot between two
records, waits until Faust's producer has flushed every output queued so far, and only then
writes the file (atomically): so no output of a checkpointed record can be lost with the crash
that makes the checkpoint useful. On restart, :func:`stream_jobs.rebuild` loads it and
replays the events topic from its offsets up to the group's committed offsets; records that
Faust delivers again and the checkpoint already holds are dropped by the processor's dedupe.

The file is a pickle of metricbus's own objects, written and read by the worker only (never
load a checkpoint from an untrusted place). A checkpoint of another format is ignored, with a
log line, and the state is rebuilt from the start of the topic.
"""

from __future__ import annotations

import logging
import os
import pickle
from pathlib import Path
from typing import Any

from schemas import Settings

from ._processor import StreamProcessor

log = logging.getLogger("metricbus.stream")

#: Bumped whenever the pickled classes change shape; older checkpoints are then ignored.
FORMAT = 4  # 4: each run's role bindings (the alias catalog); an older checkpoint is ignored: rebuilt


def checkpoint_path(settings: Settings, group_id: str) -> Path:
    """Where the worker of ``group_id`` keeps its checkpoint."""
    return settings.data_dir / "stream" / f"{group_id}.checkpoint"


def snapshot(processor: StreamProcessor, positions: dict[int, int]) -> bytes:
    """The checkpoint bytes of the processor now (take it between two records)."""
    return pickle.dumps(
        {"format": FORMAT, "positions": dict(positions), "state": processor.state()},
        protocol=pickle.HIGHEST_PROTOCOL,
    )


def write(path: Path, data: bytes) -> None:
    """Replace the checkpoint at ``path`` atomically (tmp, fsync, rename, fsync dir)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def load(path: Path, processor: StreamProcessor) -> dict[int, int] | None:
    """Restore ``processor`` from the checkpoint at ``path``; its offsets, or None if unusable."""
    try:
        data: dict[str, Any] = pickle.loads(path.read_bytes())  # noqa: S301 - our own file
    except FileNotFoundError:
        return None
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError) as exc:
        log.warning("ignoring unreadable stream checkpoint %s (%s); rebuilding from the topic", path, exc)
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        log.warning("ignoring stream checkpoint %s of another format; rebuilding from the topic", path)
        return None
    processor.load_state(data["state"])
    return {int(p): int(o) for p, o in data["positions"].items()}
