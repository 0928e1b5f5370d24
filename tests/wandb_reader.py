"""Read a W&B offline run file (``run-<id>.wandb``) back: config, history, summary.

The record reader is the W&B sink's own (``sinks._wandb_file``); this turns records into what
a user sees.
"""

from __future__ import annotations

import json
from pathlib import Path

from metricbus.sinks._wandb_file import records, run_files

__all__ = ["read_run", "records", "run_file", "run_files"]


def run_file(root: Path, run_id: str) -> Path:
    (path,) = run_files(root, run_id)
    return path


def read_run(root: Path, run_id: str, every_opening: bool = False) -> dict:
    """config, history rows, summary, projects, and everything else by record kind.

    ``every_opening``: read every run directory of the id in order (a run re-opened after a
    sink restart), else there must be exactly one.
    """
    out: dict = {"config": {}, "history": [], "summary": {}, "kinds": set(), "projects": set(), "files": 0}
    out["exit_codes"] = []  # each opening's, as W&B closed it
    files = run_files(root, run_id) if every_opening else [run_file(root, run_id)]
    out["files"] = len(files)
    for r in (record for path in files for record in records(path)):
        kind = r.WhichOneof("record_type")
        out["kinds"].add(kind)
        if kind == "run":
            out["projects"].add(r.run.project)
            out["tags"] = list(r.run.tags)
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
        elif kind == "exit":
            out["exit_codes"].append(r.exit.exit_code)
        elif kind == "summary":
            for item in r.summary.update:
                _put(out["summary"], item, json.loads(item.value_json))
    return out


def _put(target: dict, item, value) -> None:
    keys = [item.key] if item.key else list(item.nested_key)
    for key in keys[:-1]:
        if not isinstance(target.get(key), dict):  # a summary key set first to a number, then nested
            target[key] = {}
        target = target[key]
    target[keys[-1]] = value
