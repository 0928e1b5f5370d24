"""Commands that read the archive (runs, health, compare, report, export, replay, backtest) and sync."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from metricbus.schemas import MetricbusError, printable, strict_json

from ._common import (
    _find,
    _run_ref,
    _settings,
)


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
    from metricbus.diagnostics import dead_letters_of, judge, read_logged

    settings = _settings(args)
    run_id = _find(settings, str(_run_ref(args)))
    seen, _ = read_logged(settings.archive_dir, run_id)
    health = judge(run_id, seen, dead_letters_of(settings, run_id))
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
    from metricbus.diagnostics import compare_series, read_logged
    from metricbus.schemas import run_config

    settings = _settings(args)
    runs = [_find(settings, r) for r in args.runs]
    baseline = _find(settings, args.baseline) if args.baseline else runs[0]
    if baseline not in runs:
        runs.insert(0, baseline)
    if len(runs) < 2:
        raise MetricbusError("compare needs at least two runs")
    readings = {run: read_logged(settings.archive_dir, run) for run in runs}
    try:
        result = compare_series(
            {run: run_config(carried) for run, (_, carried) in readings.items()},
            {run: seen.series for run, (seen, _) in readings.items()},
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
