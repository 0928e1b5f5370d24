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

from metricbus.schemas import Settings, atomic_write

from ._processor import StreamProcessor

log = logging.getLogger("metricbus.stream")

#: Bumped whenever the pickled classes change shape; older checkpoints are then refused.
#: 11: an alert rule's state keeps its shift detector, frozen count, patience history and
#: the evaluations it was false for; 10: the rank merger keeps the lags it does not know
#: yet; 9: a series keeps where its last value was (the run's end puts its last smoothed
#: point there), per-label points wait for their step's end; 8: the classes live under
#: metricbus.stream_jobs (one installed name); 7: the rank merger's leader time, the finished
#: runs' order; 6: per-label series; 5: one checkpoint per partition (older ones: refused,
#: rebuilt)
FORMAT = 11


def checkpoint_dir(settings: Settings, group_id: str) -> Path:
    """The directory of the group's partition checkpoints."""
    base = Path(settings.checkpoint_dir) if settings.checkpoint_dir else Path(settings.data_dir) / "stream"
    return base / group_id


def partition_path(directory: Path, partition: int) -> Path:
    """Where the checkpoint of one partition goes."""
    return directory / f"partition-{int(partition)}.checkpoint"


def snapshot(processor: StreamProcessor, partition: int, offset: int) -> bytes:
    """The checkpoint bytes of one partition's processor now (take it between two records)."""
    record = {
        "format": FORMAT,
        "partition": partition,
        "offset": offset,
        "state": processor.state(),
        # a state at offset 0 that holds events came from a rebased checkpoint: it still applies
        "rebased": offset == 0 and processor.events > 0,
    }
    return pickle.dumps(record, protocol=pickle.HIGHEST_PROTOCOL)


def write(path: Path, data: bytes) -> None:
    """Replace the checkpoint at ``path`` atomically (durable when it returns)."""
    atomic_write(path, data)


def load(path: Path, processor: StreamProcessor, topic_start: bool = False) -> int | None:
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
    if topic_start and not data.get("rebased"):
        # the group never processed this partition: a checkpoint is of records gone (a new
        # `metricbus up` on an empty memory-only broker), unless it was rebased for that
        return None
    processor.load_state(data["state"])
    return int(data["offset"])


def offsets(directory: Path) -> dict[int, int]:
    """The offset each readable checkpoint of this format covers up to, per partition."""
    out = {}
    for path in sorted(Path(directory).glob("partition-*.checkpoint")):
        try:
            data = pickle.loads(path.read_bytes())  # noqa: S301 - our own file
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError):
            continue
        if isinstance(data, dict) and data.get("format") == FORMAT:
            out[int(data["partition"])] = int(data["offset"])
    return out


def rebase(directory: Path, moved: dict[int, int] | None = None) -> list[int]:
    """Checkpoints for an events topic re-created; the partitions rebased.

    Used by ``metricbus up`` when it restarts the memory-only broker on purpose (to bound its
    memory), after the workers stopped. ``moved``: per partition, the offset on the new topic of
    the first record after the checkpoint (``up`` carried it over). A partition not in it gets
    0: its state covers all of the old topic and is loaded when the new topic starts.
    Producers send their last minute again; the state's dedupe drops what it already holds.
    """
    moved = moved or {}
    done = []
    for path in sorted(Path(directory).glob("partition-*.checkpoint")):
        try:
            data = pickle.loads(path.read_bytes())  # noqa: S301 - our own file
        except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError):
            continue  # load() says so when a worker reads it
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            continue
        data.update(offset=moved.get(int(data["partition"]), 0), rebased=True)
        write(path, pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL))
        done.append(int(data["partition"]))
    return done


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
