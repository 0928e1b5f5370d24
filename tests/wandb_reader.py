"""Read a W&B offline run file (``run-<id>.wandb``) back, as a user's tool would.

The format is LevelDB's log format after a 7-byte header (``:W&B``, magic 0xBEE1, version):
32 KiB blocks of records ``crc32 u32 | length u16 | type u8 | data``, where type 1 is a whole
record and 2/3/4 the first/middle/last pieces of one, each a ``wandb_internal_pb2.Record``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

BLOCK = 32768
HEADER = 7


def records(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    pos, pieces, out = HEADER, b"", []
    while pos + HEADER <= len(data):
        room = BLOCK - pos % BLOCK
        if room < HEADER:  # the block's tail is padding
            pos += room
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        pos += HEADER
        chunk = data[pos : pos + length]
        pos += length
        if kind == 0:
            continue
        pieces = chunk if kind in (1, 2) else pieces + chunk
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pieces)
            out.append(record)
    return out


def run_files(root: Path, run_id: str) -> list[Path]:
    """Every offline run file of ``run_id`` under ``root``, oldest first (one per opening)."""
    return sorted(Path(root).glob(f"wandb/*run-*{run_id}/run-{run_id}.wandb"), key=lambda p: p.parent.name)


def run_file(root: Path, run_id: str) -> Path:
    (path,) = run_files(root, run_id)
    return path


def read_run(root: Path, run_id: str, every_opening: bool = False) -> dict:
    """config, history rows, summary, projects, and everything else by record kind.

    ``every_opening``: read every run directory of the id in order (a run re-opened after a
    sink restart), else there must be exactly one.
    """
    out: dict = {"config": {}, "history": [], "summary": {}, "kinds": set(), "projects": set(), "files": 0}
    files = run_files(root, run_id) if every_opening else [run_file(root, run_id)]
    out["files"] = len(files)
    for r in (record for path in files for record in records(path)):
        kind = r.WhichOneof("record_type")
        out["kinds"].add(kind)
        if kind == "run":
            out["projects"].add(r.run.project)
            for item in r.run.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "config":
            for item in r.config.update:
                out["config"][item.key] = json.loads(item.value_json)
        elif kind == "history":
            row: dict = {}
            for item in r.history.item:
                _put(row, item, json.loads(item.value_json))
            out["history"].append(row)
        elif kind == "summary":
            for item in r.summary.update:
                _put(out["summary"], item, json.loads(item.value_json))
    return out


def _put(target: dict, item, value) -> None:
    keys = [item.key] if item.key else list(item.nested_key)
    for key in keys[:-1]:
        target = target.setdefault(key, {})
    target[keys[-1]] = value
