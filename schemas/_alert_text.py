"""The one home of an alert's text: the console line every deliverer sends, and the dated line.

Both are terminal-safe (:func:`printable`): an alert's run id, metric and message come from a
topic and are untrusted.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

from ._names import printable


def format_alert(alert: Mapping[str, Any]) -> str:
    """One clear line: state, severity, rule, run, metric, step, message (terminal-safe)."""
    icon = {"firing": "FIRING", "resolved": "RESOLVED", "ended": "ENDED"}.get(
        alert["state"], str(alert["state"]).upper()
    )
    where = f" {alert['metric']}" if alert["metric"] != "*" else ""
    step = f" step {alert['step']}" if alert["step"] is not None else ""
    head = f"[{icon}] {alert['severity']} {alert['rule']}"
    return printable(f"{head}: run {alert['run_id']}{where}{step}: {alert['message']}")


def describe_alert(alert: Mapping[str, Any]) -> str:
    """One line for a list of alerts of one run: when (UTC), at which step, what."""
    try:
        when = datetime.datetime.fromtimestamp(alert["ts_ms"] / 1000, tz=datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M:%S"
        )
    except (ValueError, OverflowError, OSError):  # a record's time past year 9999 (a topic is untrusted)
        when = f"ts_ms={alert['ts_ms']}"
    step = "-" if alert["step"] is None else alert["step"]
    what = f"{alert['state']:<9}{alert['rule']} [{alert['severity']}] {alert['metric']}: {alert['message']}"
    return printable(f"{when}Z  step {step:>8}  {what}")
