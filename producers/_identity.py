"""What a run says about itself: its id, its config, the commit it runs from.

The id every rank of a job agrees on without talking (``METRICBUS_RUN_ID``, torchrun's
rendezvous id), the config a run is given (a mapping, a dataclass, a Namespace) and
``run.config``, which publishes what is changed in it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from metricbus.schemas import ConfigError, check_run_id


class RunConfig(dict):  # type: ignore[type-arg]
    """``run.config``: a dict whose ``update``, item assignment and ``setdefault`` publish the change.

    Copies (``copy``, ``deepcopy``, pickle) are plain dicts. Removing a key is local only: a
    config change is a set of keys, as in W&B.
    """

    def __init__(self, initial: Mapping[str, Any], publish: Callable[[Mapping[str, Any]], None]) -> None:
        super().__init__(initial)
        self._publish = publish

    def update(self, other: Any = (), /, **kwargs: Any) -> None:  # type: ignore[override]
        """Set keys and publish them."""
        self._publish({**dict(other), **kwargs})

    def __setitem__(self, key: str, value: Any) -> None:
        self._publish({key: value})

    def setdefault(self, key: str, default: Any = None) -> Any:
        """Set ``key`` (and publish it) only when it is missing."""
        if key not in self:
            self._publish({key: default})
        return self.get(key, default)

    def __reduce__(self) -> tuple[Any, ...]:
        return (dict, (dict(self),))


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:8]


def shared_run_id() -> str | None:
    """The run id every rank of one job agrees on without talking.

    ``METRICBUS_RUN_ID``, or under torchrun (``WORLD_SIZE`` > 1) one made from its rendezvous
    id ``TORCHELASTIC_RUN_ID``.
    """
    explicit = os.environ.get("METRICBUS_RUN_ID")
    if explicit:
        return check_run_id(explicit)
    elastic = os.environ.get("TORCHELASTIC_RUN_ID")
    if elastic and elastic != "none" and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1:
        return "torchrun-" + hashlib.sha256(elastic.encode()).hexdigest()[:16]
    return None


def cell(value: Any) -> Any:
    if value is None or type(value) in (bool, int, float, str):
        return value
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def config_dict(config: Any) -> dict[str, Any]:
    if config is None:
        return {}
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        return dataclasses.asdict(config)
    if isinstance(config, Mapping):
        return dict(config)
    if hasattr(config, "__dict__"):  # argparse.Namespace and friends
        return dict(vars(config))
    raise ConfigError(f"config must be a mapping, a dataclass or a Namespace (got {type(config).__name__})")


def git_commit(start: Path) -> str | None:
    """HEAD's commit of the repository around ``start``, read from .git without a subprocess."""
    for directory in (start, *start.parents):
        git = directory / ".git"
        if git.is_dir():
            try:
                head = (git / "HEAD").read_text().strip()
                if not head.startswith("ref: "):
                    return head
                ref = head[5:]
                ref_file = git / ref
                if ref_file.exists():
                    return ref_file.read_text().strip()
                packed = git / "packed-refs"
                if packed.exists():
                    for line in packed.read_text().splitlines():
                        if line.endswith(" " + ref):
                            return line.split(" ", 1)[0]
            except OSError:
                return None
            return None
    return None
