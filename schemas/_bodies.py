"""Constructors for event bodies whose shape every writer must agree on."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any


def run_started(
    project: str,
    name: str,
    config: Mapping[str, Any] | None = None,
    *,
    tags: Iterable[str] = (),
    host: str = "",
    pid: int = 0,
    git: str | None = None,
    rank: int = 0,
    world_size: int = 1,
) -> dict[str, Any]:
    """A RunStarted body (the config is stored as a JSON object, keys sorted)."""
    return {
        "project": project,
        "name": name,
        "config_json": json.dumps(dict(config or {}), default=str, sort_keys=True),
        "tags": [str(t) for t in tags],
        "host": host,
        "pid": pid,
        "git": git,
        "rank": rank,
        "world_size": world_size,
    }
