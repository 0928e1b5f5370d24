"""Where a run's events go, said to the person who started it (W&B's "View run at")."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from urllib.parse import quote

from metricbus.schemas import Settings, StackInfo, reach

from ._transport import KafkaTransport, Transport

log = logging.getLogger("metricbus.producer")


def say_where(
    run: str, run_id: str, settings: Settings, spool_dir: Path, stack: StackInfo | None, transport: Transport
) -> bool:
    """One line on stderr: ``run`` (a label), and where its events go.

    A broker found unreachable at once (nothing listens on this machine) is a warning in the
    log instead; True then (the publisher need not say it again).
    """
    if settings.offline:
        log.warning(
            "metricbus: %s in offline mode (METRICBUS_OFFLINE): its events are kept in %s; "
            "publish them with `metricbus sync`",
            run,
            spool_dir,
        )
        return False
    if stack is not None:
        line = f"{run} -> {stack.describe()}"
        if stack.dashboard_url:
            line += f"; view it at {stack.dashboard_url}runs/{quote(run_id)}"
    elif refused_here(settings, transport):
        log.warning(
            "metricbus: %s: the broker at %s is unreachable (nothing listens there: start one with "
            "`metricbus up`); its events are kept in %s, sent when it answers or by the next "
            "`metricbus up` (or `metricbus sync`)",
            run,
            settings.bootstrap_servers,
            spool_dir,
        )
        return True
    else:
        line = f"{run} -> {describe_target(settings)}"
    if not os.environ.get("METRICBUS_QUIET"):
        print(f"metricbus: {line}", file=sys.stderr, flush=True)
    return False


def refused_here(settings: Settings, transport: Transport) -> bool:
    """Whether a broker on this machine refuses the connection (instant; remote hosts are not tried)."""
    if not isinstance(transport, KafkaTransport):
        return False
    host = settings.bootstrap_servers.split(",")[0].rpartition(":")[0].strip("[]")
    if host not in ("127.0.0.1", "localhost", "::1"):
        return False
    try:
        reach(settings, timeout_s=0.3)
    except Exception:  # noqa: BLE001 - kafka's connection error: nothing listens
        return True
    return False


def describe_target(settings: Settings) -> str:
    """Where the events are sent, for a person."""
    if settings.offline:
        return "nothing (offline mode: METRICBUS_OFFLINE)"
    if settings.is_local:
        return (
            f"the local metricbus broker at {settings.bootstrap_servers} (start it with "
            "`metricbus up`, or set METRICBUS_BOOTSTRAP)"
        )
    return f"Kafka at {settings.bootstrap_servers}"
