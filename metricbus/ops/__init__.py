"""Ops: what is running and how it is doing, read from Kafka and each process's counters.

This room owns ``metricbus status`` (``_status``), consumer lag and its Burrow-style verdict
(``_lag``), the run board that folds events and alerts into one summary per run (``_board``),
the pipeline's state sampled for the dashboard (``_pipeline``), the live dashboard with its
health checks (``_web`` and the ``web/`` assets), the Prometheus ``/metrics`` endpoint
(``_metrics``), the runs the topics no longer hold, drawn from the archive (``_archived``),
and the collection of media files no run refers to any more (``_media_gc``). Ops consumes like
a sink and never slows one;
it never imports the supervisor (``metricbus.stack``).
"""

from __future__ import annotations

import importlib
import typing
from typing import Any

if typing.TYPE_CHECKING:
    from ._archived import RuleFiles
    from ._status import ask_dashboard, collect, format_status, from_dashboard, unreachable
    from ._web import serve

#: where each public name lives: imported on first use, so ``status`` does not load the
#: dashboard's web stack and the archive's readers it never calls
_HOMES = {
    "RuleFiles": "._archived",
    "ask_dashboard": "._status",
    "collect": "._status",
    "format_status": "._status",
    "from_dashboard": "._status",
    "unreachable": "._status",
    "serve": "._web",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name], __name__), name)

__all__ = ["RuleFiles", "ask_dashboard", "collect", "format_status", "from_dashboard", "serve", "unreachable"]
