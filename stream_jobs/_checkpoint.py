"""Checkpoints of the stream job's state, one per partition of the events topic.

Runs are keyed by run id, so all of a run's events are in one partition and the state splits
by partition: a partition's checkpoint is all another worker needs to take the partition over.
It holds that partition's processor state and the offset after the last record the state
includes. The worker takes the snapshot between two records, waits until every output queued
so far was acknowledged by the broker, and only then writes the file (atomically): so no
output of a checkpointed record can be lost with the crash that makes the checkpoint useful.

Where: ``<checkpoint dir>/<group>/partition-<p>.checkpoint``. The checkpoint directory is
``METRICBUS_CHECKPOINT_DIR`` when set (a directory every worker of the group reads: a shared
volume when the workers run on several machines), else ``<data dir>/stream``.

The file is a pickle of metricbus's own objects, written and read by the workers only (never
load a checkpoint from an untrusted place). A checkpoint of another format is refused with a
log line naming it; the partition's state is then rebuilt from the start of the topic.
"""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from typing import Any

from schemas import Settings, atomic_write

from ._processor import StreamProcessor

log = logging.getLogger("metricbus.stream")

#: Bumped whenever the pickled classes change shape; older checkpoints are then refused.
FORMAT = 6  # 6: per-label series; 5: one checkpoint per partition (older ones: refused, rebuilt)


def checkpoint_dir(settings: Settings, group_id: str) -> Path:
    """The directory of the group's partition checkpoints."""
    base = Path(settings.checkpoint_dir) if settings.checkpoint_dir else Path(settings.data_dir) / "stream"
    return base / group_id


def partition_path(directory: Path, partition: int) -> Path:
    """Where the checkpoint of one partition goes."""
    return directory / f"partition-{int(partition)}.checkpoint"


def snapshot(processor: StreamProcessor, partition: int, offset: int) -> bytes:
    """The checkpoint bytes of one partition's processor now (take it between two records)."""
    record = {"format": FORMAT, "partition": partition, "offset": offset, "state": processor.state()}
    return pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)


def write(path: Path, data: bytes) -> None:
    """Replace the checkpoint at ``path`` atomically (durable when it returns)."""
    atomic_write(path, data)


def load(path: Path, processor: StreamProcessor) -> int | None:
    """Restore ``processor`` from the checkpoint at ``path``; its offset.

    None when there is no usable one: the caller rebuilds from the start of the topic.
    """
    try:
        data: dict[str, Any] = pickle.loads(path.read_bytes())  # noqa: S301 - our own file
    except FileNotFoundError:
        return None
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError) as exc:
        log.warning("refusing unreadable stream checkpoint %s (%s); rebuilding from the topic", path, exc)
        return None
    found = data.get("format") if isinstance(data, dict) else None
    if found != FORMAT:
        log.warning(
            "refusing stream checkpoint %s of format %s (this worker reads format %d); "
            "rebuilding the partition from the start of the topic",
            path,
            found,
            FORMAT,
        )
        return None
    processor.load_state(data["state"])
    return int(data["offset"])


def retire_single_file(settings: Settings, group_id: str) -> None:
    """Remove the one-file checkpoint of workers before format 5 (it cannot be split), saying so."""
    old = Path(settings.data_dir) / "stream" / f"{group_id}.checkpoint"
    if old.exists():
        log.warning(
            "removing %s: a checkpoint of every partition in one file (before format %d); "
            "each partition's state is rebuilt from the topic once",
            old,
            FORMAT,
        )
        old.unlink()
