"""Reading a W&B run file (``run-<id>.wandb``): what the W&B sink recovers from after a crash.

The format is LevelDB's log format after a 7-byte header (``:W&B``, magic 0xBEE1, version):
32 KiB blocks of records ``crc32 u32 | length u16 | type u8 | data``, where type 1 is a whole
record and 2/3/4 the first/middle/last pieces of one, each a ``wandb_internal_pb2.Record``.
A file whose writer was killed may end inside a record: reading stops there.
"""

from __future__ import annotations

import json
import logging
import struct
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7
#: how long a finish waits for W&B's service to close the run file
FILE_CLOSE_TIMEOUT_S = 30.0

log = logging.getLogger("metricbus.sinks")


def finish(run: Any, exit_code: int = 0, timeout_s: float = FILE_CLOSE_TIMEOUT_S) -> bool:
    """``run.finish(exit_code)``, then wait until W&B has closed its file (:func:`wait_closed`).

    The W&B sink reads that file back as its ledger on a run's next opening, and anyone
    reading the run right after (``wandb sync``, a test) needs it whole. False, with a
    warning, when it was not closed within ``timeout_s``.
    """
    path = run.settings.sync_file
    run.finish(exit_code=exit_code)
    if wait_closed(path, timeout_s):
        return True
    log.warning("W&B run %s: %s was not closed %.0fs after finish", run.id, path, timeout_s)
    return False


def records(path: Path) -> Iterator[Any]:
    """The file's records in order, up to the first torn or unreadable one."""
    from google.protobuf.message import DecodeError

    for data in _pieces(Path(path).read_bytes(), path):
        try:
            yield _record(data)
        except DecodeError:
            return


def closed(path: Path) -> bool:
    """Whether W&B has closed the run file: its last record is the run's ``exit``.

    Only the last record is decoded, so this stays cheap on a long run's file.
    """
    from google.protobuf.message import DecodeError

    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return False
    try:
        last = deque(_pieces(data, path), maxlen=1)
        return bool(last) and _record(last[0]).WhichOneof("record_type") == "exit"
    except (DecodeError, ValueError):  # not a W&B run file: never closed by W&B
        return False


def wait_closed(path: Path, timeout_s: float) -> bool:
    """Wait until W&B has closed the run file (``closed``); False after ``timeout_s``.

    ``run.finish()`` returns before W&B's service has written the run's buffered records
    (it is told to close the file with a message it does not answer): a reader right after
    ``finish()`` can find the file empty.
    """
    deadline = time.monotonic() + timeout_s
    size = -1
    while True:
        try:
            now = Path(path).stat().st_size
        except FileNotFoundError:
            now = -1
        if now != size and closed(path):  # read again only when the file has grown
            return True
        size = now
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _pieces(data: bytes, path: Path) -> Iterator[bytes]:
    """The serialized records of a run file's bytes, up to the first torn one."""
    if len(data) < HEADER and b":W&B\xe1\xbe".startswith(data[:6]):
        return  # W&B had not written its header yet (its writer buffers until the file closes)
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    pos, pieces = HEADER, b""
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # the block's tail is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        chunk = data[pos : pos + length]
        if len(chunk) < length:
            return  # torn: the writer died here
        pos += length
        if kind == 0:
            continue
        pieces = chunk if kind in (1, 2) else pieces + chunk
        if kind in (1, 4):
            yield pieces


def _record(data: bytes) -> Any:
    from wandb.proto import wandb_internal_pb2

    record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
    record.ParseFromString(data)
    return record


def run_files(root: Path, run_id: str) -> list[Path]:
    """Every run file of ``run_id`` under ``root``, oldest first (one per opening of the run)."""
    # W&B names a run's directory <mode>-run-<time>-<id>, then -1, -2... in the same second
    # (``latest-run`` is a link to one of them)
    found = [p for p in Path(root).glob(f"wandb/*/run-{run_id}.wandb") if not p.parent.is_symlink()]

    def opening(path: Path) -> tuple[str, int]:
        stem, _, suffix = path.parent.name.rpartition(run_id)
        return stem, int(suffix[1:]) if suffix[1:].isdigit() else 0

    return sorted(found, key=opening)


def logged_ids(root: Path, run_id: str, key: str) -> list[str]:
    """The values of history key ``key`` in every opening of the run (the sink's row identities)."""
    out = []
    for path in run_files(root, run_id):
        for record in records(path):
            if record.WhichOneof("record_type") != "history":
                continue
            for item in record.history.item:
                if item.key == key or (not item.key and list(item.nested_key) == [key]):
                    out.append(json.loads(item.value_json))
    return out
