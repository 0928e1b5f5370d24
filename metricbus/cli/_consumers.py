"""The long-running consumers: `sink`, `worker`, `alerts`."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import signal
from pathlib import Path
from typing import Any

from metricbus.schemas import MediaStore, MetricbusError

from ._common import (
    _settings,
    _wait_for_broker,
    log,
)
from ._logs import Printable


def cmd_sink(args: argparse.Namespace) -> int:
    from metricbus.sinks import SinkRunner, make_sink, take_temp_dir

    settings = _settings(args)
    default = settings.archive_dir if args.sink == "parquet" else settings.data_dir / args.sink
    out = Path(args.logdir) if args.logdir else default
    if args.sink == "wandb":  # wandb's temporary files in the sink's own directory, not /tmp
        take_temp_dir(out)
    sink = make_sink(
        args.sink,
        out,
        include=tuple(args.include or ()),
        exclude=tuple(args.exclude or ()),
        layout=Path(args.layout) if args.layout else None,
        media=MediaStore.of(settings),
    )
    if args.alerts and args.sink != "wandb":
        raise MetricbusError("--alerts is the W&B sink's: it raises each alert on the run it holds open")
    topics = [settings.topics.events, settings.topics.aggregates]  # derived series reach every sink
    _wait_for_broker(settings, args)
    runner = SinkRunner(
        sink, settings, topics=topics, flush_interval_s=args.flush_interval, alerts=args.alerts
    )

    import asyncio  # here: importing the command line (``status``) never pays for it

    async def main() -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop)
        stats = await runner.run()
        log.info("sink %s stopped: %s", args.sink, dataclasses.asdict(stats))

    asyncio.run(main())
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    import faust

    from metricbus.stream_jobs import (
        DEFAULT_RULES,
        PartitionedState,
        build_app,
        checkpoint_dir,
        group_id,
        load_config,
        load_rules,
        retire_single_file,
        settle_heap,
    )

    settings = _settings(args)
    rules = load_rules(args.rules or DEFAULT_RULES)
    cfg = load_config(args.config) if args.config else None
    _wait_for_broker(settings, args)
    retire_single_file(settings, group_id(settings))
    # each partition's state is rebuilt when the group assigns it to this worker
    state = PartitionedState(settings, cfg, rules, directory=checkpoint_dir(settings, group_id(settings)))
    app = build_app(settings, state)
    # Faust's worker logs at WARN (its handlers too); a partition's state moving here is worth a line
    stream_log = logging.getLogger("metricbus.stream")
    handler = logging.StreamHandler()
    handler.setFormatter(Printable("[%(asctime)s] [%(process)d] [%(levelname)s] %(message)s"))
    stream_log.addHandler(handler)
    stream_log.setLevel(logging.INFO)
    stream_log.propagate = False
    log.info("stream worker: %d alert rules from %s", len(rules), args.rules or DEFAULT_RULES)
    worker = faust.Worker(app, loglevel="WARN", quiet=True)
    settle_heap()
    worker.execute_from_commandline()  # handles SIGINT/SIGTERM itself; exits the process
    return 0


def cmd_alerts(args: argparse.Namespace) -> int:
    from metricbus.sinks.alerts import AlertRunner, ConsoleAlerts, WandbAlerts, WebhookAlerts

    settings = _settings(args)
    if sum(map(bool, (args.console, args.webhook, args.wandb))) > 1:
        raise MetricbusError(
            "choose one consumer: --console (default), --webhook URL or --wandb (one process per consumer)"
        )
    try:
        if not (args.webhook or args.wandb):
            handler: Any = ConsoleAlerts()
        elif args.webhook:
            handler = WebhookAlerts(args.webhook, give_up_s=args.give_up_s)
        else:
            handler = WandbAlerts(settings.data_dir / "wandb-alerts", runs=settings.data_dir / "wandb")
    except ValueError as exc:
        raise MetricbusError(str(exc)) from None
    group = settings.groups.alerts(args.group or handler.name)
    _wait_for_broker(settings, args)

    import asyncio  # here: importing the command line (``status``) never pays for it

    async def main() -> None:
        runner = AlertRunner(settings, handler, group_id=group)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop)
        stats = await runner.run()
        log.info("alerts %s stopped: %s", handler.name, stats)

    asyncio.run(main())
    return 0
