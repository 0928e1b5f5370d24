"""Commands that start things: `broker`, `up`, `topics`, `demo`."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from metricbus.schemas import MetricbusError, Settings, ensure_topics

from ._common import (
    _settings,
    _stop_on_signals,
    _wait_for_broker,
)


def cmd_broker(args: argparse.Namespace) -> int:
    from metricbus.stack import EmbeddedBroker

    settings = _settings(args)
    stop = _stop_on_signals()
    with EmbeddedBroker(settings.local_port) as broker:
        print(f"embedded broker (Tansu, memory-only) on {broker.bootstrap}; Ctrl-C stops it", flush=True)
        while not stop.wait(0.5):
            if broker.proc is not None and broker.proc.poll() is not None:
                print(f"broker exited with code {broker.proc.returncode}", file=sys.stderr)
                return 1
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from metricbus.schemas import announce, this_process, withdraw
    from metricbus.stack import Stack

    settings = _settings(args)
    consumers = up_consumers(args)
    stop = _stop_on_signals()
    stack = Stack(settings, consumers)
    delivery = None
    try:
        stack.start()
        announce(
            this_process(
                bootstrap=settings.bootstrap,
                local_port=settings.local_port if settings.is_local else None,
                data_dir=str(Path(settings.data_dir).expanduser().resolve()),
                topic_prefix=settings.topic_prefix,
                dashboard_url=stack.dashboard_url,
            )
        )
        print(stack.describe(), flush=True)
        stack.wait_started(stop)
        if not stop.is_set():
            print("metricbus is up; Ctrl-C stops everything", flush=True)
            delivery = deliver_spools(settings)
        stack.run_until(stop)
    finally:
        withdraw()
        print("metricbus: stopping the consumers (each flushes and commits), then the broker", flush=True)
        stack.stop()
        if delivery is not None:
            delivery.join(10.0)  # its sends fail fast once the broker is gone
        print("metricbus stopped", flush=True)
    return 0


def deliver_spools(settings: Settings) -> threading.Thread | None:
    """Publish, on a thread of its own, what runs logged while no stack ran (``metricbus sync``).

    Says on the terminal how many runs wait, and then what was published. None when none wait.
    Spools of live runs are left to their own publishers.
    """
    from metricbus.producers import pending_spools, sync_spools

    waiting = pending_spools(settings.spool_dir)
    if not waiting:
        return None
    runs = len({p.parent for p in waiting})
    where = settings.spool_dir
    print(f"spool        {runs} run(s) logged while no stack ran wait in {where}: publishing", flush=True)

    def sync() -> None:
        try:
            report = sync_spools(settings)
        except MetricbusError as exc:
            print(f"spool        not published ({exc}); `metricbus sync` publishes them later", flush=True)
            return
        done = len({p.parent for p in report.spools_done})
        print(f"spool        published {report.events_sent} events of {done} run(s)", flush=True)
        for path, why in report.spools_failed.items():
            later = "`metricbus sync` publishes it later"
            print(f"spool        {path.parent.name} not published ({why}); {later}", flush=True)

    thread = threading.Thread(target=sync, name="metricbus-up-spools", daemon=True)
    thread.start()
    return thread


def up_consumers(args: argparse.Namespace) -> dict[str, list[str]]:
    """The consumer processes `up` runs, by name: their CLI arguments after `metricbus`."""
    from metricbus.stack import available_consumers

    consumers = available_consumers()
    if args.wandb_alerts and args.no_wandb:
        raise MetricbusError("--wandb-alerts raises alerts through the W&B sink, which --no-wandb leaves out")
    for flag, name in (("no_tensorboard", "sink-tensorboard"), ("no_wandb", "sink-wandb")):
        if getattr(args, flag):
            consumers.pop(name, None)
    if args.wandb_alerts:
        if "sink-wandb" not in consumers:
            raise MetricbusError("--wandb-alerts needs the W&B sink: pip install 'metricbus[wandb]'")
        consumers["sink-wandb"] = [*consumers["sink-wandb"], "--alerts"]
    if args.no_dashboard:
        consumers.pop("dashboard", None)
    elif "dashboard" in consumers and args.dashboard_port:
        consumers["dashboard"] = [*consumers["dashboard"], "--port", str(args.dashboard_port)]
    for name in ("stream-worker", "dashboard"):  # the dashboard runs them over archived runs
        for flag in ("rules", "config"):
            if name in consumers and getattr(args, flag):  # resolved: a restarted child finds it
                path = str(Path(getattr(args, flag)).resolve())
                consumers[name] = [*consumers[name], f"--{flag}", path]
    for count, names in (
        (args.workers, ["stream-worker"]),
        (args.sink_instances, [n for n in consumers if n.startswith(("sink-", "alerts-"))]),
    ):
        if count < 1:
            raise MetricbusError("--workers and --sink-instances must be at least 1")
        for name in names:  # more members of the same consumer group: the partitions are shared
            for i in range(2, count + 1):
                consumers[f"{name}-{i}"] = consumers[name]
    return consumers


def cmd_topics(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _wait_for_broker(settings, args)
    created = ensure_topics(settings, timeout_s=args.timeout)
    print(
        f"topics ready on {settings.bootstrap_servers}"
        + (f" (created {', '.join(created)})" if created else "")
    )
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from metricbus.demo import run_demo

    return run_demo(_settings(args), updates=args.updates)
