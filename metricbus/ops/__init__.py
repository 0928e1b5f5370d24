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

from ._archived import RuleFiles
from ._status import ask_dashboard, collect, format_status, from_dashboard, unreachable
from ._web import serve

__all__ = ["RuleFiles", "ask_dashboard", "collect", "format_status", "from_dashboard", "serve", "unreachable"]
