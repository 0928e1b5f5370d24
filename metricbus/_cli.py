"""The ``metricbus`` command. Every process of the production shape is a subcommand here."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import difflib
import json
import logging
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from metricbus.schemas import MetricbusError, Settings, ensure_topics, printable, strict_json

log = logging.getLogger("metricbus")


#: commands that start a stack of their own: they never join a running one
_STARTS_A_STACK = {"up", "broker", "demo"}


def _settings(args: argparse.Namespace) -> Settings:
    """Settings from the flags, the environment and, for a client, the running stack (said once)."""
    settings, stack = Settings.resolve(
        discover=args.command not in _STARTS_A_STACK,
        bootstrap=args.bootstrap,
        data_dir=Path(args.data_dir).expanduser() if args.data_dir else None,
        topic_prefix=args.topic_prefix,
        local_port=getattr(args, "port", None),
    )
    if stack is not None:
        print(f"metricbus {args.command}: using {stack.describe()}", file=sys.stderr, flush=True)
    return settings


def _add_run(parser: argparse.ArgumentParser, optional: bool = False) -> None:
    """The run a command takes, the same way everywhere: positional or ``--run``."""
    parser.add_argument("run", nargs="?", help="run id, id prefix or name")
    parser.add_argument("--run", dest="run_option", metavar="RUN", help="the same, as a flag")
    parser.set_defaults(run_optional=optional)


def _run_ref(args: argparse.Namespace) -> str | None:
    ref = args.run or args.run_option
    if args.run and args.run_option and args.run != args.run_option:
        raise MetricbusError(f"two runs given ({args.run!r} and --run {args.run_option!r}); give one")
    if ref is None and not args.run_optional:
        raise MetricbusError(
            f"metricbus {args.command} needs a run (id, id prefix or name): `metricbus runs` lists them"
        )
    return ref


def _find(settings: Settings, ref: str) -> str:
    """The archived run ``ref`` names (id, id prefix or name)."""
    from metricbus._runs import find_run

    return find_run(settings.archive_dir, ref)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


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
        stack.run_until(stop)
    finally:
        withdraw()
        print("metricbus: stopping the consumers (each flushes and commits), then the broker", flush=True)
        stack.stop()
        print("metricbus stopped", flush=True)
    return 0


def up_consumers(args: argparse.Namespace) -> dict[str, list[str]]:
    """The consumer processes `up` runs, by name: their CLI arguments after `metricbus`."""
    from metricbus.stack import available_consumers

    consumers = available_consumers()
    if args.wandb_alerts:
        if "sink-wandb" not in consumers:
            raise MetricbusError("--wandb-alerts needs the W&B sink: pip install 'metricbus[wandb]'")
        consumers["sink-wandb"] = [*consumers["sink-wandb"], "--alerts"]
    if args.no_dashboard:
        consumers.pop("dashboard", None)
    elif "dashboard" in consumers and args.dashboard_port:
        consumers["dashboard"] = [*consumers["dashboard"], "--port", str(args.dashboard_port)]
    if "stream-worker" in consumers:
        for flag in ("rules", "config"):
            if getattr(args, flag):  # resolved: a restarted child must find it wherever it runs
                path = str(Path(getattr(args, flag)).resolve())
                consumers["stream-worker"] = [*consumers["stream-worker"], f"--{flag}", path]
    for count, names in (
        (args.workers, ["stream-worker"]),
        (args.sink_instances, [n for n in consumers if n.startswith("sink-")]),
    ):
        if count < 1:
            raise MetricbusError("--workers and --sink-instances must be at least 1")
        for name in names:  # more members of the same consumer group: the partitions are shared
            for i in range(2, count + 1):
                consumers[f"{name}-{i}"] = consumers[name]
    return consumers


def _wait_for_broker(settings: Settings, args: argparse.Namespace) -> None:
    from metricbus.schemas import wait_for_broker

    wait_for_broker(settings, args.wait_s, f"metricbus {args.command}")


def cmd_topics(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _wait_for_broker(settings, args)
    created = ensure_topics(settings, timeout_s=args.timeout)
    print(
        f"topics ready on {settings.bootstrap_servers}"
        + (f" (created {', '.join(created)})" if created else "")
    )
    return 0


def cmd_sink(args: argparse.Namespace) -> int:
    from metricbus.sinks import SinkRunner, make_sink

    settings = _settings(args)
    default = settings.archive_dir if args.sink == "parquet" else settings.data_dir / args.sink
    sink = make_sink(
        args.sink,
        Path(args.logdir) if args.logdir else default,
        include=tuple(args.include or ()),
        exclude=tuple(args.exclude or ()),
        layout=Path(args.layout) if args.layout else None,
    )
    if args.alerts and args.sink != "wandb":
        raise MetricbusError("--alerts is the W&B sink's: it raises each alert on the run it holds open")
    topics = [settings.topics.events, settings.topics.aggregates]  # derived series reach every sink
    _wait_for_broker(settings, args)
    runner = SinkRunner(
        sink, settings, topics=topics, flush_interval_s=args.flush_interval, alerts=args.alerts
    )

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
            handler = WebhookAlerts(args.webhook)
        else:
            handler = WandbAlerts(settings.data_dir / "wandb-alerts", runs=settings.data_dir / "wandb")
    except ValueError as exc:
        raise MetricbusError(str(exc)) from None
    group = settings.groups.alerts(args.group or handler.name)
    _wait_for_broker(settings, args)

    async def main() -> None:
        runner = AlertRunner(settings, handler, group_id=group)
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, runner.stop)
        stats = await runner.run()
        log.info("alerts %s stopped: %s", handler.name, stats)

    asyncio.run(main())
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    from metricbus._replay import archived_runs, replay_to_kafka, replay_to_sink
    from metricbus.sinks import make_sink

    settings = _settings(args)
    ref = _run_ref(args)
    if (ref is None) == (args.project is None):
        raise MetricbusError("metricbus replay takes a run (id, id prefix or name) or --project P, not both")
    if args.source == "kafka" and not ref:
        raise MetricbusError("--from kafka replays one run (the topic is keyed by run id)")
    if args.source == "kafka":
        runs = [str(ref)]
    else:
        runs = archived_runs(settings.archive_dir, _find(settings, ref) if ref else None, args.project)
    if args.to == "kafka":
        if not args.to_prefix or args.to_prefix == settings.topic_prefix:
            raise MetricbusError(
                "--to kafka needs --to-prefix NEW. (a fresh set of topics, not the live ones)"
            )
        target = dataclasses.replace(settings, topic_prefix=args.to_prefix)
        if args.source == "kafka":
            raise MetricbusError("--from kafka --to kafka: use the stream worker on the live topics instead")
        n = replay_to_kafka(settings, target, runs)
        print(f"republished {n} events of {len(runs)} run(s) to {target.topics.events}")
        return 0
    if not args.out:
        raise MetricbusError(f"--to {args.to} needs --out DIR (a fresh directory)")
    read, written = replay_to_sink(settings, runs, make_sink(args.to, Path(args.out)), source=args.source)
    held = read - written
    print(
        f"replayed {read} events (logged and derived) of {len(runs)} run(s) into {args.to} at {args.out}"
        + (f"; {held} were already there and were not written again" if held else "")
    )
    if args.to == "tensorboard":
        print(f"  tensorboard --logdir {args.out}")
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    from metricbus._replay import backtest
    from metricbus.schemas import describe_alert
    from metricbus.stream_jobs import DEFAULT_RULES

    settings = _settings(args)
    run_id = _find(settings, str(_run_ref(args)))
    rules = Path(args.rules) if args.rules else DEFAULT_RULES
    alerts = backtest(settings, rules, run_id, Path(args.config) if args.config else None)
    for alert in alerts:
        print(describe_alert(alert))
    firing = sum(a["state"] == "firing" for a in alerts)
    print(f"{firing} alert(s) would have fired on run {run_id} ({len(alerts)} transitions)")
    return 0


def cmd_sync(args: argparse.Namespace) -> int:
    from metricbus.producers import sync_spools

    settings = _settings(args)
    report = sync_spools(settings)
    print(
        f"published {report.records_sent} records from {len(report.spools_done)} spool(s) to "
        f"{settings.bootstrap_servers}"
    )
    for path in report.spools_busy:
        print(f"skipped {path}: its run is still live and publishes it itself")
    for path, why in report.spools_failed.items():
        print(f"failed {path}: {why}; run `metricbus sync` again when Kafka is reachable", file=sys.stderr)
    return 1 if report.spools_failed else 0


def cmd_runs(args: argparse.Namespace) -> int:
    from metricbus._runs import run_rows

    settings = _settings(args)
    rows = run_rows(settings.archive_dir, args.project)
    now_ms = time.time() * 1000
    for row in rows:
        last = row["last_ts_ms"]
        if not row["finished"]:
            live = last is not None and now_ms - last < LIVE_S * 1000
            row["state"] = "live" if live else "stopped, unfinished"
    if args.json:
        print(strict_json(rows, indent=2))
        return 0
    if not rows:
        where = f" of project {args.project!r}" if args.project else ""
        print(f"no run{where} in the archive at {settings.archive_dir}")
        return 0
    table = [("NAME", "PROJECT", "STATE", "STEPS", "EVENTS", "LAST EVENT", "RUN ID")]
    for row in rows:
        steps = "-" if row["last_step"] is None else f"{row['first_step']}..{row['last_step']}"
        ago = "-" if row["last_ts_ms"] is None else _ago((now_ms - row["last_ts_ms"]) / 1000)
        table.append(
            (row["name"], row["project"], row["state"], steps, str(row["events"]), ago, row["run_id"])
        )
    widths = [min(40, max(len(printable(r[i])) for r in table)) for i in range(len(table[0]))]
    for r in table:
        print("  ".join(printable(c)[:w].ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


#: a run whose last archived event is younger than this (seconds) and that has not finished is live
LIVE_S = 60.0


def _ago(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 129600:
        return f"{seconds / 3600:.0f} h ago"
    return f"{seconds / 86400:.0f} days ago"


def cmd_health(args: argparse.Namespace) -> int:
    from metricbus._replay import archived
    from metricbus.diagnostics import assess, dead_letters_of

    settings = _settings(args)
    run_id = _find(settings, str(_run_ref(args)))
    events = (e for chunk in archived(settings, run_id) for e in chunk)
    health = assess(run_id, events, dead_letters_of(settings, run_id))
    if args.json:
        print(strict_json(health.as_dict(), indent=2))
        return 0
    print(f"run {run_id}: health {health.score:.0f}/100")
    for part in health.parts:
        print(f"  {part.name:<13} -{part.deducted:>4.1f} of {part.weight}")
        for line in part.evidence:
            print(f"      {printable(line)}")
    if health.labels:
        print("  per label (final-window means; not scored but for progress above):")
        for row in health.labels:
            values = ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k not in ("label", "events"))
            print(
                printable(f"      {row['label']}: {row['events']} events" + (f", {values}" if values else ""))
            )
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    from metricbus._replay import archived
    from metricbus.diagnostics import compare_series, read_run

    settings = _settings(args)
    runs = [_find(settings, r) for r in args.runs]
    baseline = _find(settings, args.baseline) if args.baseline else runs[0]
    if baseline not in runs:
        runs.insert(0, baseline)
    if len(runs) < 2:
        raise MetricbusError("compare needs at least two runs")
    readings = {run: read_run(archived(settings, run)) for run in runs}
    try:
        result = compare_series(
            {run: r.config for run, r in readings.items()},
            {run: r.seen.series for run, r in readings.items()},
            baseline,
            args.metric,
            args.window,
            args.x,
        )
    except KeyError as exc:
        raise MetricbusError(
            f"--x {args.x}: a run never logged {exc}; use step, time or a shared metric"
        ) from None
    if args.json:
        print(strict_json(result.as_dict(), indent=2))
        return 1 if result.regressions() else 0
    cut = f", every run cut at {args.x} = {result.budget:.6g}" if result.budget is not None else ""
    print(f"baseline {baseline}; runs on the {args.x} axis{cut}")
    print("config keys that differ:" if result.config_diff else "configs are identical")
    for key, values in result.config_diff.items():
        print(printable(f"  {key}: " + ", ".join(f"{run}={value!r}" for run, value in values.items())))
    if result.group_metrics:
        print("groups of seeds (runs that differ only in seed keys):")
        for group, members in result.groups.items():
            print(printable(f"  {group}: {', '.join(members)}"))
        print("across seeds: Welch's t-test on each run's final-window mean (effect size: Hedges' g)")
        for r in result.group_metrics:
            flag = "REGRESSION" if r.verdict == "worse" else r.verdict
            print(
                printable(
                    f"  {r.metric:<32} {r.group}: {r.mean:.4g} vs {r.baseline_mean:.4g}  "
                    f"(n={len(r.means)} vs {len(r.baseline_means)})  p={r.p_value:.3g}  "
                    f"g={r.effect_size:+.2f}  {flag}"
                )
            )
    print("per run: final windows compared with Welch's t-test (effect size: Hedges' g)")
    for m in result.metrics:
        flag = "REGRESSION" if m.verdict == "worse" and not result.group_metrics else m.verdict
        print(
            printable(
                f"  {m.metric:<32} {m.run}: {m.mean:.4g} vs {m.baseline_mean:.4g}  p={m.p_value:.3g}  "
                f"g={m.effect_size:+.2f}  {flag}"
            )
        )
    return 1 if result.regressions() else 0


def cmd_report(args: argparse.Namespace) -> int:
    from metricbus._replay import archived, raising
    from metricbus.diagnostics import build, read_run
    from metricbus.schemas import check_run_id
    from metricbus.stream_jobs import DEFAULT_RULES

    settings = _settings(args)
    run_id = _find(settings, str(_run_ref(args)))
    rules = Path(args.rules) if args.rules else DEFAULT_RULES
    config = Path(args.config) if args.config else None
    compared = [_find(settings, c) for c in args.compare or ()]
    others = {r: read_run(archived(settings, r, derived=True)) for r in compared}
    alerts: list[dict[str, Any]] = []
    run = read_run(
        archived(settings, run_id, derived=True), lambda logged: raising(logged, alerts, rules, config)
    )
    page = build(run_id, run, others, alerts)
    out = Path(args.out) if args.out else settings.data_dir / "reports" / f"{check_run_id(run_id)}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    print(f"wrote {out} ({len(page) // 1024} kB); open it in a browser, no network needed")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    from metricbus.sinks import tidy

    settings = _settings(args)
    run_id = _find(settings, str(_run_ref(args)))
    table = tidy(settings.archive_dir, run_id, labels=True)
    if table.num_rows == 0:
        raise MetricbusError(f"run {run_id!r} has no scalars in the archive at {settings.archive_dir}")
    if table["labels"].null_count == table.num_rows:  # a run logged without labels: five columns
        table = table.drop_columns(["labels"])
    if args.format == "parquet":
        if not args.out:
            raise MetricbusError("--format parquet needs --out FILE")
        pq.write_table(table, args.out, compression="zstd")
    elif args.format == "csv":
        if "labels" in table.column_names:  # a CSV cell holds text: the labels as a JSON object
            text = [None if v is None else json.dumps(dict(v)) for v in table["labels"].to_pylist()]
            table = table.set_column(
                table.column_names.index("labels"), "labels", pa.array(text, pa.string())
            )
        sink: Any = args.out or sys.stdout.buffer
        pacsv.write_csv(table, sink)
    else:
        out = open(args.out, "w") if args.out else sys.stdout  # noqa: SIM115
        try:
            for batch in table.to_batches(max_chunksize=1 << 16):  # not every row as a dict at once
                for row in batch.to_pylist():
                    row["wall_time"] = row["wall_time"].isoformat()
                    if not math.isfinite(row["value"]):  # JSON has no NaN: null, as pandas writes it
                        row["value"] = None
                    if "labels" in row:
                        row["labels"] = dict(row["labels"] or ())
                    out.write(json.dumps(row) + "\n")
        finally:
            if args.out:
                out.close()
    if args.out:
        print(f"wrote {table.num_rows} rows to {args.out}", file=sys.stderr)
    return 0


def cmd_status(args: argparse.Namespace) -> int:
    from metricbus.ops import collect, format_status, unreachable
    from metricbus.schemas import BrokerError

    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # an unreachable broker is said once, below
    settings = _settings(args)
    stop = _stop_on_signals() if args.watch else threading.Event()
    while True:
        try:
            snap = collect(settings, window_s=args.window, stop_after_s=args.stop_after, since_s=args.since)
        except BrokerError as exc:  # said, with what is kept here (the spools); --watch goes on
            snap = unreachable(settings, str(exc))
            if not args.watch:
                print(strict_json(snap, indent=2) if args.json else format_status(snap), flush=True)
                raise
        if args.json:
            print(strict_json(snap, indent=None if args.watch else 2), flush=True)
        else:
            print(("\x1b[2J\x1b[H" if args.watch and sys.stdout.isatty() else "") + format_status(snap))
            print(flush=True)
        if not args.watch or stop.wait(args.watch):
            return 0 if snap["healthy"] else 1


def cmd_dashboard(args: argparse.Namespace) -> int:
    from metricbus.ops import serve

    settings = _settings(args)
    token = args.token or os.environ.get("METRICBUS_DASHBOARD_TOKEN") or None
    if args.host not in ("127.0.0.1", "localhost", "::1") and not token:
        raise MetricbusError(
            f"--host {args.host} serves the dashboard beyond this machine: give it a --token "
            "(or METRICBUS_DASHBOARD_TOKEN), which every request must carry"
        )
    url = f"http://{args.host}:{args.web_port}/"
    print(f"metricbus dashboard on {url} (Kafka {settings.bootstrap_servers})", flush=True)
    serve(settings, host=args.host, port=args.web_port, token=token, since_s=args.since)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from metricbus.demo import run_demo

    return run_demo(_settings(args), updates=args.updates)


def _global_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap", help="Kafka bootstrap servers (default: $METRICBUS_BOOTSTRAP, else the local stack)"
    )
    p.add_argument(
        "--data-dir", help="spool, archive and logs (default: $METRICBUS_DATA_DIR or ~/.metricbus)"
    )
    p.add_argument("--topic-prefix", help="prefix of every topic (default: metricbus.)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging, and the Kafka clients' own")


WAIT_HELP = "no broker yet: wait at most S seconds, then exit 2 (default: no limit)"


class _Parser(argparse.ArgumentParser):
    """argparse, with a did-you-mean for an unknown flag (``--output`` -> ``--out``)."""

    def error(self, message: str) -> NoReturn:
        if message.startswith("unrecognized arguments: "):
            known = {o for a in _all_actions(self) for o in a.option_strings}
            for word in message.split(": ", 1)[1].split():
                flag = word.split("=", 1)[0]
                close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6) if flag[:1] == "-" else []
                if close:
                    message += f" (did you mean {close[0]}?)"
        super().error(message)


def _all_actions(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions and those of its commands."""
    out = list(parser._actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out += sub._actions
    return out


def build_parser() -> argparse.ArgumentParser:
    """The argument parser (exposed so tests can check every documented command exists)."""
    p = _Parser(prog="metricbus", description=__doc__)
    _global_options(p)
    # the same options after the command too (`metricbus up --data-dir X`): given there, they win
    common = _Parser(add_help=False, argument_default=argparse.SUPPRESS)
    _global_options(common)
    sub = p.add_subparsers(dest="command", required=True)

    def command(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = sub.add_parser(name, parents=[common], **kwargs)
        return parser

    s = command("broker", help="run the embedded Kafka-protocol broker (Tansu) in the foreground")
    s.add_argument("--port", type=int, help="port on 127.0.0.1 (default 9092)")
    s.set_defaults(func=cmd_broker)

    s = command("up", help="broker (unless --bootstrap) + topics + every consumer, until Ctrl-C")
    s.add_argument("--port", type=int, help="port of the embedded broker (default 9092)")
    s.add_argument("--rules", help="alert rules YAML for the stream worker (default: the seed rule pack)")
    s.add_argument(
        "--config", help="StreamConfig YAML for the stream worker (see `metricbus worker --config`)"
    )
    s.add_argument(
        "--dashboard-port", type=int, help="dashboard on 127.0.0.1:PORT (default 8765, or a free one)"
    )
    s.add_argument("--no-dashboard", action="store_true", help="run no dashboard")
    s.add_argument(
        "--wandb-alerts",
        action="store_true",
        help="the W&B sink also raises each alert as a W&B alert on its run (`sink wandb --alerts`)",
    )
    s.add_argument(
        "--workers", type=int, default=1, help="stream workers in the group (they share the partitions)"
    )
    s.add_argument(
        "--sink-instances", type=int, default=1, help="instances of each sink in its group (share partitions)"
    )
    s.set_defaults(func=cmd_up)

    s = command("topics", help="create the metricbus topics if missing (idempotent)")
    s.add_argument("--timeout", type=float, default=30.0)
    s.add_argument("--wait-s", type=float, metavar="S", help=WAIT_HELP)
    s.set_defaults(func=cmd_topics)

    s = command("sink", help="run one sink consumer")
    s.add_argument("sink", choices=["parquet", "tensorboard", "wandb"])
    s.add_argument(
        "--logdir", help="tensorboard / wandb: output root (default: <data dir>/tensorboard or /wandb)"
    )
    s.add_argument(
        "--include", action="append", metavar="GLOB", help="tensorboard, wandb: only metrics matching"
    )
    s.add_argument(
        "--exclude", action="append", metavar="GLOB", help="tensorboard, wandb: never metrics matching"
    )
    s.add_argument(
        "--layout",
        metavar="FILE",
        help="tensorboard: YAML of your own custom-scalars charts (category -> chart -> tag regexes)",
    )
    s.add_argument(
        "--alerts",
        action="store_true",
        help="wandb: also raise each alert of the alerts topic as a W&B alert on its run (once)",
    )
    s.add_argument("--flush-interval", type=float, default=2.0, help="seconds between durable flushes")
    s.add_argument("--wait-s", type=float, metavar="S", help=WAIT_HELP)
    s.set_defaults(func=cmd_sink)

    s = command("worker", help="run the stream jobs (rolling statistics, epochs, alerts)")
    s.add_argument("--rules", help="alert rules YAML (default: the seed rule pack)")
    s.add_argument(
        "--config", help="YAML of StreamConfig fields: windows, names, metric_stats (default: the seeds')"
    )
    s.add_argument("--wait-s", type=float, metavar="S", help=WAIT_HELP)
    s.set_defaults(func=cmd_worker)

    s = command("alerts", help="deliver alerts: one line each on the console, or POST to a webhook")
    s.add_argument("--console", action="store_true", help="print each alert as one line (the default)")
    s.add_argument(
        "--webhook", metavar="URL", help="POST Slack-compatible JSON to URL (retries with backoff)"
    )
    s.add_argument(
        "--wandb",
        action="store_true",
        help="raise each alert as a W&B alert on its run, from this process (prefer `sink wandb --alerts`)",
    )
    s.add_argument(
        "--group", help="consumer group suffix (default: console / webhook / wandb); one group per endpoint"
    )
    s.add_argument("--wait-s", type=float, metavar="S", help=WAIT_HELP)
    s.set_defaults(func=cmd_alerts)

    s = command("replay", help="re-materialise archived runs in a new sink or a fresh set of topics")
    _add_run(s, optional=True)
    s.add_argument("--project", help="every run of this project (instead of one run)")
    s.add_argument(
        "--from",
        dest="source",
        choices=["archive", "kafka"],
        default="archive",
        help="where the events come from (default: the Parquet archive)",
    )
    s.add_argument("--to", required=True, choices=["tensorboard", "wandb", "parquet", "kafka"])
    s.add_argument("--out", help="directory for --to tensorboard / wandb / parquet")
    s.add_argument(
        "--to-prefix", help="topic prefix for --to kafka (fresh topics; the stream worker can run on them)"
    )
    s.set_defaults(func=cmd_replay)

    s = command("backtest", help="what alert rules would have fired on an archived run")
    s.add_argument("--rules", help="alert rules YAML (default: the seed rule pack, as `metricbus up` runs)")
    s.add_argument("--config", help="YAML of StreamConfig fields, as for `metricbus worker --config`")
    _add_run(s)
    s.set_defaults(func=cmd_backtest)

    s = command("sync", help="publish what runs left in their local spools")
    s.set_defaults(func=cmd_sync)

    s = command("runs", help="the archived runs: name, project, state, steps, events, last event, id")
    s.add_argument("--project", help="only this project's runs")
    s.add_argument("--json", action="store_true", help="one JSON array of the runs, with config and summary")
    s.set_defaults(func=cmd_runs)

    s = command("health", help="a run's health 0-100 from the archive, each part with its evidence")
    _add_run(s)
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_health)

    s = command(
        "compare",
        help="runs side by side: config diff, final-window statistics, Welch's t-test (exit 1: regression)",
    )
    s.add_argument("runs", nargs="+", metavar="RUN", help="run ids, id prefixes or names")
    s.add_argument("--baseline", help="the run the others are compared with (default: the first)")
    s.add_argument("--metric", action="append", help="only these metrics (repeatable; default: all shared)")
    s.add_argument("--window", type=int, help="values in the final window (default: the last tenth, >= 5)")
    s.add_argument(
        "--x",
        default="step",
        help="the axis runs line up on: step, time (seconds since the start) or a logged metric "
        "(env steps, tokens); runs are cut at the largest x all of them reached",
    )
    s.add_argument("--json", action="store_true")
    s.set_defaults(func=cmd_compare)

    s = command("report", help="one self-contained HTML report of a run (charts, health, epochs)")
    _add_run(s)
    s.add_argument(
        "--compare", action="append", metavar="RUN", help="overlay and test another run (repeatable)"
    )
    s.add_argument("--out", help="the HTML file to write (default: <data dir>/reports/<run>.html)")
    s.add_argument("--rules", help="alert rules for the alert timeline (default: the default rules)")
    s.add_argument("--config", help="stream config the rules' derived series follow (YAML)")
    s.set_defaults(func=cmd_report)

    s = command(
        "export",
        help="one run's scalars as tidy rows (run, step, name, value, wall_time, and labels when it has any)",
    )
    _add_run(s)
    s.add_argument("--format", choices=["csv", "json", "parquet"], default="csv", help="json = JSON Lines")
    s.add_argument("--out", help="file to write (default: stdout; required for parquet)")
    s.set_defaults(func=cmd_export)

    s = command(
        "status",
        help="runs, consumer lag and status per group, dead letters, local spools (exit 1 on STOP/ERR)",
    )
    s.add_argument("--json", action="store_true", help="one JSON object (one per line with --watch)")
    s.add_argument("--watch", type=float, metavar="S", help="again every S seconds until Ctrl-C")
    s.add_argument(
        "--window", type=float, default=3.0, help="seconds between the two lag samples a status is judged on"
    )
    s.add_argument(
        "--stop-after",
        type=float,
        default=30.0,
        help="a group whose oldest waiting record is older than this, with no progress, is STOP",
    )
    s.add_argument("--since", type=float, metavar="S", help="read runs from the last S seconds only")
    s.set_defaults(func=cmd_status)

    s = command(
        "dashboard", help="the live web dashboard, /metrics (Prometheus), /healthz and /readyz"
    )
    s.add_argument(
        "--host", default="127.0.0.1", help="address to bind (anything but loopback needs --token)"
    )
    s.add_argument("--port", dest="web_port", type=int, default=8765)
    s.add_argument("--token", help="required on every request (default: $METRICBUS_DASHBOARD_TOKEN)")
    s.add_argument("--since", type=float, metavar="S", help="read runs from the last S seconds only")
    s.set_defaults(func=cmd_dashboard)

    s = command(
        "demo", help="embedded stack + a short real PPO run on CartPole, read back from the archive"
    )
    s.add_argument("--updates", type=int, default=30, help="PPO updates (each 512 environment steps)")
    s.add_argument("--port", type=int, help="port of the embedded broker (default 9092)")
    s.set_defaults(func=cmd_demo)
    return p


class Repeats(logging.Filter):
    """A Kafka client's line said again within ``every_s`` is counted, not printed.

    With the broker down (or restarting under ``metricbus up``) kafka-python logged two ERROR
    lines a second in every process that waits for it (the dashboard: 29 in 20 s). The first
    is printed; the next one after ``every_s`` says how many were held back.
    """

    def __init__(self, every_s: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every_s, self.clock = every_s, clock
        self._said: dict[tuple[str, str], tuple[float, int]] = {}  # (logger, template): (when, held)
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(("kafka", "aiokafka")):
            return True
        key, now = (record.name, str(record.msg)), self.clock()
        with self._lock:
            when, held = self._said.get(key, (None, 0))
            if when is not None and now - when < self.every_s:
                self._said[key] = (when, held + 1)
                return False
            self._said[key] = (now, 0)
        if held:
            record.msg, record.args = f"{record.getMessage()} (and {held} more like it held back)", None
        return True


class Printable(logging.Formatter):
    """Log lines with every non-printable character of the message escaped (:func:`printable`).

    Messages quote names from topics; a newline or an ANSI escape in one would forge or hide a
    line of the terminal `metricbus up` writes to. Tracebacks keep their lines (each escaped).
    """

    def formatMessage(self, record: logging.LogRecord) -> str:  # noqa: N802 - logging's name
        return printable(super().formatMessage(record))

    def formatException(self, ei: Any) -> str:  # noqa: N802 - logging's name
        return "\n".join(map(printable, super().formatException(ei).split("\n")))


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``metricbus`` console script."""
    args = build_parser().parse_args(argv)
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig, with a Printable formatter
        console = logging.StreamHandler()
        console.setFormatter(Printable("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        root.addHandler(console)
        root.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    for noisy in ("kafka", "aiokafka", "tensorboard"):  # their chatter is ours to report, once
        logging.getLogger(noisy).setLevel(logging.ERROR if not args.verbose else logging.INFO)
    for handler in logging.getLogger().handlers:
        handler.addFilter(Repeats())
    try:
        return int(args.func(args))
    except MetricbusError as exc:
        print(f"metricbus {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C before a command's own handler (waiting for the broker)
        print(f"metricbus {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `metricbus export ... | head`: the reader has what it wanted
        # what is still buffered would fail again at exit: it goes nowhere (Python's docs' recipe)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
