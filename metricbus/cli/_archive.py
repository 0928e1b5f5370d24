"""Commands that read the archive (runs, health, compare, report, export, replay, backtest) and sync."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from metricbus.schemas import MediaStore, MetricbusError, printable, strict_json

from ._common import (
    _find,
    _run_ref,
    _settings,
)


def cmd_replay(args: argparse.Namespace) -> int:
    from metricbus.replay import archived_runs, replay_to_kafka, replay_to_sink
    from metricbus.sinks import make_sink, take_temp_dir

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
    if args.to == "wandb":  # wandb's temporary files in the output directory, not /tmp
        take_temp_dir(Path(args.out))
    sink = make_sink(args.to, Path(args.out), media=MediaStore.of(settings))
    read, written = replay_to_sink(settings, runs, sink, source=args.source)
    held = read - written
    print(
        f"replayed {read} events (logged and derived) of {len(runs)} run(s) into {args.to} at {args.out}"
        + (f"; {held} were already there and were not written again" if held else "")
    )
    if args.to == "tensorboard":
        print(f"  tensorboard --logdir {args.out}")
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    from metricbus.diagnostics._backtest import backtest
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
        f"published {report.events_sent} events ({report.records_sent} records) of "
        f"{len({p.parent for p in report.spools_done})} run(s) to {settings.bootstrap_servers}"
    )
    for path in report.spools_busy:
        print(f"skipped {path}: its run is still live and publishes it itself")
    for path, why in report.spools_failed.items():
        print(f"failed {path}: {why}; run `metricbus sync` again when Kafka is reachable", file=sys.stderr)
    return 1 if report.spools_failed else 0


def cmd_gc(args: argparse.Namespace) -> int:
    from metricbus.ops._media_gc import collect

    settings = _settings(args)
    done = collect(settings, grace_s=args.grace_s, dry_run=args.dry_run)
    verb = "would delete" if args.dry_run else "deleted"
    print(
        f"media store {settings.media_root}: {verb} {done.removed} item(s) no event references "
        f"({done.freed_bytes:,} bytes); kept {done.kept} ({done.referenced} referenced by the archive "
        f"and the spools, the rest younger than {args.grace_s:g} s)"
    )
    return 0


def cmd_runs(args: argparse.Namespace) -> int:
    from metricbus.diagnostics._runs import run_rows

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


#: how long ``metricbus health`` waits for the running stack's dashboard to judge a run
DASHBOARD_HEALTH_TIMEOUT_S = 30.0


def cmd_health(args: argparse.Namespace) -> int:
    settings = _settings(args)
    run_id = _find(settings, str(_run_ref(args)))
    health = _health_of_stack(args, run_id)  # a stack's dashboard has the archive's reader warm
    if health is None:
        from metricbus.diagnostics import dead_letters_of, judge, read_logged

        seen, _ = read_logged(settings.archive_dir, run_id)
        health = judge(run_id, seen, dead_letters_of(settings, run_id)).as_dict()
    if args.json:
        print(strict_json(health, indent=2))
        return 0
    source = f"  (as {health['source']} judged it)" if health.get("source") else ""
    print(f"run {run_id}: health {health['score']:.0f}/100{source}")
    for part in health["parts"]:
        print(f"  {part['name']:<13} {points_of(part)}")
        for line in part["evidence"]:
            print(f"      {printable(line)}")
    if health["labels"]:
        print("  per label (final-window means; not scored but for progress above):")
        for row in health["labels"]:
            values = ", ".join(f"{k} {v:.4g}" for k, v in row.items() if k not in ("label", "events"))
            print(
                printable(f"      {row['label']}: {row['events']} events" + (f", {values}" if values else ""))
            )
    return 0


def _health_of_stack(args: argparse.Namespace, run_id: str) -> dict[str, Any] | None:
    """The run's health as the joined stack's dashboard judges it (dead letters too); None if none does."""
    stack = args.joined_stack
    if stack is None or not stack.dashboard_url:
        return None
    from urllib.parse import quote

    from metricbus.ops import ask_dashboard

    path = f"api/runs/{quote(run_id, safe='')}/health?dead_letters=1"
    found = ask_dashboard(stack.dashboard_url, path, DASHBOARD_HEALTH_TIMEOUT_S)
    if not isinstance(found, dict) or found.get("run_id") != run_id:
        return None
    return {**found, "source": f"the dashboard at {stack.dashboard_url}"}


def _read_all(archive: Path, runs: list[str]) -> dict[str, Any]:
    """``read_logged`` of each run, several at a time (threads: pyarrow and numpy free the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    from metricbus.diagnostics import read_logged

    with ThreadPoolExecutor(max_workers=min(4, len(runs))) as pool:
        return dict(zip(runs, pool.map(lambda run: read_logged(archive, run), runs), strict=True))


def cmd_compare(args: argparse.Namespace) -> int:
    from metricbus.diagnostics import compare_series
    from metricbus.diagnostics._compare import flatten, group_runs
    from metricbus.diagnostics._runs import run_rows
    from metricbus.schemas import run_config

    settings = _settings(args)
    runs = [_find(settings, r) for r in args.runs]
    if args.project:
        project = [row["run_id"] for row in run_rows(settings.archive_dir, args.project)]
        if not project:
            raise MetricbusError(f"no run of project {args.project!r} in the archive {settings.archive_dir}")
        runs += [r for r in project if r not in runs]
    keys = [k.strip() for given in args.group_by or () for k in given.split(",") if k.strip()] or None
    as_group = args.baseline if args.baseline and "=" in args.baseline else None
    baseline: str | None = runs[0] if runs else None
    if args.baseline and not as_group:
        baseline = _find(settings, args.baseline)
    if baseline is not None and baseline not in runs:
        runs.insert(0, baseline)
    if len(runs) < 2:
        raise MetricbusError("compare needs at least two runs (name them, or give --project P)")
    readings = _read_all(settings.archive_dir, runs)
    configs = {run: run_config(carried) for run, (_, carried) in readings.items()}
    have = sorted({k for c in configs.values() for k in flatten(c)})
    for key in keys or ():
        if key not in have:
            raise MetricbusError(
                f"--group-by {key}: no run's config has it; their keys: {', '.join(have) or 'none'}"
            )
    try:
        result = compare_series(
            configs,
            {run: seen.series for run, (seen, _) in readings.items()},
            baseline,
            args.metric,
            args.window,
            args.x,
            group_by=keys,
            baseline_group=as_group,
        )
    except KeyError as exc:
        if as_group and exc.args == (as_group,):
            groups = group_runs(configs, keys)
            raise MetricbusError(
                f"--baseline {as_group}: no such group; the groups: {', '.join(groups)}"
            ) from None
        raise MetricbusError(
            f"--x {args.x}: a run never logged {exc}; use step, time or a shared metric"
        ) from None
    if args.json:
        print(strict_json(result.as_dict(), indent=2))
        return 1 if result.regressions() else 0
    names = {run: _run_name(carried) or run for run, (_, carried) in readings.items()}
    if len(set(names.values())) < len(names):  # two runs of one name: their ids say which is which
        names = {run: run for run in names}
    print_comparison(
        result, args.x, names, by_run=as_group is None, grouped=keys is not None, all_runs=args.per_run
    )
    return 1 if result.regressions() else 0


def _run_name(events: list[Any]) -> str | None:
    from metricbus.schemas import RUN_STARTED

    return next((str(e.body["name"]) for e in events if e.kind == RUN_STARTED), None)


def print_comparison(
    result: Any,
    axis: str,
    names: dict[str, str],
    by_run: bool = True,
    grouped: bool = False,
    all_runs: bool = False,
) -> None:
    """``compare``'s answer for a terminal: config diff, groups with their IQMs, runs (by name).

    Groups are shown when there are several and one holds several runs (seeds), or the user
    grouped (``grouped``). When groups were compared, the runs one by one are shown only with
    ``all_runs`` (they do not decide the exit status).
    """
    from metricbus.diagnostics._groups import interval_text

    cut = f", every run cut at {axis} = {result.budget:.6g}" if result.budget is not None else ""
    baseline = names[result.baseline] if by_run else result.baseline_group
    several = len(result.groups) > 1 and any(len(members) > 1 for members in result.groups.values())
    shown = grouped or several
    said = f"{result.baseline_group} (the group of {baseline})" if shown and by_run else baseline
    print(printable(f"{len(names)} runs; baseline {said}; runs on the {axis} axis{cut}"))
    if len(names) <= 12 and any(name != run for run, name in names.items()):  # which run each name is
        print(printable("runs: " + ", ".join(f"{name} = {run}" for run, name in names.items())))
    print("config keys that differ:" if result.config_diff else "configs are identical")
    for key, values in result.config_diff.items():
        if len(values) > 4:  # the values, not every run
            counts = collections.Counter(repr(v) for v in values.values())
            line = ", ".join(f"{v} ({n} runs)" if n > 1 else v for v, n in counts.items())
        else:
            line = ", ".join(f"{names[run]}={value!r}" for run, value in values.items())
        print(printable(f"  {key}: {line}"))
    if shown:
        by = ", ".join(result.group_by) or "nothing: the configs agree but for seeds"
        print(printable(f"groups (by {by}):"))
        for group, members in result.groups.items():
            home = " (baseline)" if group == result.baseline_group else ""
            print(printable(f"  {group}{home}: {', '.join(names[r] for r in members)}"))
        print(
            "each group: the IQM of its runs' final-window means [95% bootstrap interval]; against the "
            "baseline, Welch's test on those means and the 95% interval of the difference it implies"
        )
        against = {(c.metric, c.group): c for c in result.group_metrics}
        for metric in dict.fromkeys(sc.metric for sc in result.group_scores):
            scores = [sc for sc in result.group_scores if sc.metric == metric]
            way = "higher" if scores[0].higher_is_better else "lower"
            print(printable(f"  {metric} ({way} is better)"))
            for sc in scores:
                line = f"    {sc.group:<28} IQM {sc.iqm:.4g}{interval_text(*sc.interval)}  n={len(sc.runs)}"
                if sc.group == result.baseline_group:
                    line += "  (baseline)"
                print(printable(line + ("  <- best IQM" if sc.best else "")))
                c = against.get((metric, sc.group))
                if c is not None:
                    flag = "REGRESSION, " if c.verdict == "worse" else ""
                    print(
                        printable(
                            f"      vs baseline: mean {c.mean - c.baseline_mean:+.4g}, "
                            f"Welch p={c.p_value:.3g}, g={c.effect_size:+.2f}: {flag}{c.said}"
                        )
                    )
    if not by_run or (shown and result.group_metrics and not all_runs):
        if result.metrics:
            print("(each run against the baseline run: --per-run)")
        return
    print(f"per run, against {baseline}: final windows compared with Welch's t-test (effect size: Hedges' g)")
    for m in result.metrics:
        flag = "REGRESSION, " if m.verdict == "worse" and not result.group_metrics else ""
        print(
            printable(
                f"  {m.metric:<32} {names[m.run]}: {m.mean:.4g} vs {m.baseline_mean:.4g}  p={m.p_value:.3g}  "
                f"g={m.effect_size:+.2f}  {flag}{m.said}"
            )
        )


def points_of(part: dict[str, Any]) -> str:
    """``28.5 of 30 (1.5 deducted)``: a health part as a score, read the way it is meant."""
    from metricbus.diagnostics._health import shown_points

    weight = part["weight"]
    kept, lost = shown_points(weight, part["deducted"])
    return f"{kept:>4.1f} of {weight}  " + ("(nothing deducted)" if lost == 0 else f"({lost:.1f} deducted)")


def cmd_report(args: argparse.Namespace) -> int:
    from metricbus.diagnostics import build, read_run
    from metricbus.diagnostics._backtest import archived, raising
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
    page = build(run_id, run, others, alerts, media=MediaStore.of(settings))
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
