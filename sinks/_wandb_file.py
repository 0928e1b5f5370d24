"""Reading a W&B run file (``run-<id>.wandb``): what the W&B sink recovers from after a crash.

The format is LevelDB's log format after a 7-byte header (``:W&B``, magic 0xBEE1, version):
32 KiB blocks of records ``crc32 u32 | length u16 | type u8 | data``, where type 1 is a whole
record and 2/3/4 the first/middle/last pieces of one, each a ``wandb_internal_pb2.Record``.
A file whose writer was killed may end inside a record: reading stops there.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

BLOCK = 32768
HEADER = 7


def records(path: Path) -> Iterator[Any]:
    """The file's records in order, up to the first torn or unreadable one."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
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
            record = wandb_internal_pb2.Record()  # type: ignore[attr-defined]
            try:
                record.ParseFromString(pieces)
            except DecodeError:
                return
            yield record


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
