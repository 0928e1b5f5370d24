"""Ops commands: `status` and `dashboard`."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading

from metricbus.schemas import MetricbusError, strict_json

from ._common import (
    _settings,
    _stop_on_signals,
)


def cmd_status(args: argparse.Namespace) -> int:
    from metricbus.ops import collect, format_status, from_dashboard, unreachable
    from metricbus.schemas import BrokerError

    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # an unreachable broker is said once, below
    settings = _settings(args)
    stop = _stop_on_signals() if args.watch else threading.Event()
    stack = args.joined_stack
    dashboard = stack.dashboard_url if stack is not None and not args.sample and args.since is None else None
    while True:
        try:
            snap = from_dashboard(settings, dashboard) if dashboard else None
            if snap is None:  # no stack's dashboard to ask: sample the groups here, a window apart
                snap = collect(
                    settings, window_s=args.window, stop_after_s=args.stop_after, since_s=args.since
                )
        except BrokerError as exc:  # said, with what is kept here (the spools); --watch goes on
            snap = unreachable(settings, str(exc))
            if not args.watch:  # said once, in the answer: the exit status an error's (2)
                print(strict_json(snap, indent=2) if args.json else format_status(snap), flush=True)
                return 2
        if args.json:
            print(strict_json(snap, indent=None if args.watch else 2), flush=True)
        else:
            print(("\x1b[2J\x1b[H" if args.watch and sys.stdout.isatty() else "") + format_status(snap))
            print(flush=True)
        if not args.watch or stop.wait(args.watch):
            return 0 if snap["healthy"] else 1


def cmd_dashboard(args: argparse.Namespace) -> int:
    from metricbus.ops import RuleFiles, serve

    settings = _settings(args)
    token = args.token or os.environ.get("METRICBUS_DASHBOARD_TOKEN") or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not token:
        raise MetricbusError(
            f"--host {args.host} serves the dashboard beyond this machine: give it a --token "
            "(or METRICBUS_DASHBOARD_TOKEN), which every request must carry"
        )
    url = f"http://{args.host}:{args.web_port}/"
    print(f"metricbus dashboard on {url} (Kafka {settings.bootstrap_servers})", flush=True)
    rules = RuleFiles.of(args.rules, args.config)
    serve(settings, host=args.host, port=args.web_port, token=token, since_s=args.since, rules=rules)
    return 0
