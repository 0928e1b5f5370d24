"""Reading a W&B run file (``run-<id>.wandb``): what the W&B sink recovers from after a crash.

The format is LevelDB's log format after a 7-byte header (``:W&B``, magic 0xBEE1, version):
32 KiB blocks of records ``crc32 u32 | length u16 | type u8 | data``, where type 1 is a whole
record and 2/3/4 the first/middle/last pieces of one, each a ``wandb_internal_pb2.Record``.
A file whose writer was killed may end inside a record: reading stops there. Files are read
a block at a time (a long run's file is GBs: ~350 bytes a row), and ``closed`` reads only the
last two blocks.
"""

from __future__ import annotations

import functools
import json
import logging
import struct
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

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

    with open(path, "rb") as f:
        for data in _pieces(f, path):
            try:
                yield _record(data)
            except DecodeError:
                return


def closed(path: Path) -> bool:
    """Whether W&B has closed the run file: its last record is the run's ``exit``.

    Only the last two blocks are read and the last record decoded (the exit record is small:
    it starts in one of them), so this stays cheap on a long run's file.
    """
    from google.protobuf.message import DecodeError

    try:
        with open(path, "rb") as f:
            size = f.seek(0, 2)
            start = max(0, (size - 1) // BLOCK - 1) * BLOCK
            last = deque(_pieces(f, path, start), maxlen=1)
    except (FileNotFoundError, ValueError):  # not there yet, or not a W&B run file
        return False
    try:
        return bool(last) and _record(last[0]).WhichOneof("record_type") == "exit"
    except DecodeError:
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


def _pieces(f: BinaryIO, path: Path, start: int = 0) -> Iterator[bytes]:
    """The serialized records of an open run file from block offset ``start``, up to the first torn one.

    From a block past the first, the pieces of a record begun before it are skipped. Not a W&B
    run file (wrong header, or ``closed`` found none of its own ``:W&B``): no records, or
    ValueError when reading from the start.
    """
    for _, data in _placed_pieces(f, path, start):
        if data is not None:
            yield data


def _placed_pieces(f: BinaryIO, path: Path, start: int = 0) -> Iterator[tuple[int, bytes | None]]:
    """:func:`_pieces` with the block offset where each record began; last, ``(resume, None)``.

    ``resume``: the block offset to read from next time to miss no record (the block where a
    record not yet whole began, else the last block read).
    """
    f.seek(0)
    head = f.read(HEADER)
    if len(head) < HEADER and b":W&B\xe1\xbe".startswith(head[:6]):
        return  # W&B had not written its header yet (its writer buffers until the file closes)
    if head[:4] != b":W&B":
        if start:
            return
        raise ValueError(f"{path} is not a W&B run file")
    at = start
    f.seek(start)
    block = f.read(BLOCK)
    pos = HEADER if start == 0 else 0
    pieces, whole = b"", start == 0  # whole: the record being gathered began in what was read
    began, gathering = start, False
    while True:
        while pos + HEADER <= len(block):  # fewer bytes left: the block's tail is padding
            _crc, length, kind = struct.unpack_from("<IHB", block, pos)
            pos += HEADER
            chunk = block[pos : pos + length]
            if len(chunk) < length:
                yield (began if gathering else at), None
                return  # torn: the writer died here (or is writing it now)
            pos += length
            if kind == 0:
                continue
            if kind in (1, 2):
                pieces, whole, began = chunk, True, at
            else:
                pieces += chunk
            gathering = kind in (2, 3)
            if kind in (1, 4) and whole:
                yield began, pieces
        if len(block) < BLOCK:
            yield (began if gathering else at), None
            return  # the end of the file
        at += BLOCK
        block, pos = f.read(BLOCK), 0


def _record(data: bytes) -> Any:
    record = _record_type()()
    record.ParseFromString(data)
    return record


@functools.cache
def _record_type() -> Any:
    """W&B's Record message (imported once: an import statement per record cost a third)."""
    from wandb.proto import wandb_internal_pb2

    return wandb_internal_pb2.Record  # type: ignore[attr-defined]


def run_files(root: Path, run_id: str) -> list[Path]:
    """Every run file of ``run_id`` under ``root``, oldest first (one per opening of the run)."""
    # W&B names a run's directory <mode>-run-<time>-<id>, then -1, -2... in the same second
    # (``latest-run`` is a link to one of them)
    found = [p for p in Path(root).glob(f"wandb/*/run-{run_id}.wandb") if not p.parent.is_symlink()]

    def opening(path: Path) -> tuple[str, int]:
        stem, _, suffix = path.parent.name.rpartition(run_id)
        return stem, int(suffix[1:]) if suffix[1:].isdigit() else 0

    return sorted(found, key=opening)


def logged_ids_from(path: Path, key: str, start: int) -> tuple[list[Any], int]:
    """:func:`logged_ids` of the records that begin at block offset ``start`` or later.

    With the block offset to read from next time (records already read may be read again
    from there). A file not there or not written yet: nothing, and ``start``.
    """
    found: list[Any] = []
    resume, needle = start, key.encode()
    try:
        with open(path, "rb") as f:
            for began, data in _placed_pieces(f, path, start):
                if data is None:
                    resume = began
                elif needle in data:
                    found.extend(_ids(data, key))
    except (FileNotFoundError, ValueError):
        return [], start
    return found, resume


def _ids(data: bytes, key: str) -> list[Any]:
    """The value of history key ``key`` in one serialized record, if it is a history row with it."""
    from google.protobuf.message import DecodeError

    try:
        record = _record(data)
    except DecodeError:
        return []
    if record.WhichOneof("record_type") != "history":
        return []
    for item in record.history.item:
        nested = item.nested_key
        if item.key == key or (len(nested) == 1 and nested[0] == key and not item.key):
            return [json.loads(item.value_json)]
    return []


def logged_ids(path: Path, key: str) -> Iterator[Any]:
    """The values of history key ``key`` in one run file (the sink's row identities).

    A record without ``key``'s bytes is not decoded, and a row's search stops at its identity
    (one a row).
    """
    needle = key.encode()
    with open(path, "rb") as f:
        for data in _pieces(f, path):
            if needle in data:
                yield from _ids(data, key)
