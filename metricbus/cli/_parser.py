"""The `metricbus` argument parser: every command, its flags, and a did-you-mean."""

from __future__ import annotations

import argparse
import difflib
from typing import Any, NoReturn

from ._archive import (
    cmd_backtest,
    cmd_compare,
    cmd_export,
    cmd_gc,
    cmd_health,
    cmd_replay,
    cmd_report,
    cmd_runs,
    cmd_sync,
)
from ._common import (
    WAIT_HELP,
    _add_run,
)
from ._consumers import cmd_alerts, cmd_sink, cmd_worker
from ._ops import cmd_dashboard, cmd_status
from ._stack import cmd_broker, cmd_demo, cmd_topics, cmd_up


def _global_options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--bootstrap", help="Kafka bootstrap servers (default: $METRICBUS_BOOTSTRAP, else the local stack)"
    )
    p.add_argument(
        "--data-dir", help="spool, archive and logs (default: $METRICBUS_DATA_DIR or ~/.metricbus)"
    )
    p.add_argument("--topic-prefix", help="prefix of every topic (default: metricbus.)")
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging, and the Kafka clients' own")


DESCRIPTION = "The metricbus command. Every process of the production shape is a command here."


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
    p = _Parser(prog="metricbus", description=DESCRIPTION)
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
    s.add_argument(
        "--port",
        type=int,
        help="the embedded broker's port (default 9092; the dashboard's is --dashboard-port)",
    )
    s.add_argument("--rules", help="alert rules YAML for the stream worker (default: the built-in rule pack)")
    s.add_argument(
        "--config", help="StreamConfig YAML for the stream worker (see `metricbus worker --config`)"
    )
    s.add_argument(
        "--dashboard-port",
        type=int,
        help="the dashboard's port on 127.0.0.1 (default: the one this data dir's dashboard had last, "
        "else 8765, else a free one)",
    )
    s.add_argument("--no-dashboard", action="store_true", help="run no dashboard")
    s.add_argument("--no-tensorboard", action="store_true", help="run no TensorBoard sink")
    s.add_argument(
        "--no-wandb", action="store_true", help="run no W&B sink (the Parquet archive always runs)"
    )
    s.add_argument(
        "--wandb-alerts",
        action="store_true",
        help="the W&B sink also raises each alert as a W&B alert on its run (`sink wandb --alerts`)",
    )
    s.add_argument(
        "--workers", type=int, default=1, help="stream workers in the group (they share the partitions)"
    )
    s.add_argument(
        "--sink-instances",
        type=int,
        default=1,
        help="instances of each sink and alert deliverer in its group (they share partitions)",
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
    s.add_argument("--rules", help="alert rules YAML (default: the built-in rule pack)")
    s.add_argument(
        "--config", help="YAML of StreamConfig fields: windows, names, metric_stats (default: built-in)"
    )
    s.add_argument("--wait-s", type=float, metavar="S", help=WAIT_HELP)
    s.set_defaults(func=cmd_worker)

    s = command("alerts", help="deliver alerts: one line each on the console, or POST to a webhook")
    s.add_argument("--console", action="store_true", help="print each alert as one line (the default)")
    s.add_argument(
        "--webhook",
        metavar="URL",
        help="POST Slack-compatible JSON to URL, each alert until it is taken (backoff up to 30 s)",
    )
    s.add_argument(
        "--give-up-s",
        type=float,
        default=3600.0,
        metavar="S",
        help="webhook: dead-letter an alert the endpoint refused this long (default 3600; it is "
        "given up sooner when a later alert resolves it)",
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
    s.add_argument("--rules", help="alert rules YAML (default: the built-in pack, as `metricbus up` runs)")
    s.add_argument("--config", help="YAML of StreamConfig fields, as for `metricbus worker --config`")
    _add_run(s)
    s.set_defaults(func=cmd_backtest)

    s = command("sync", help="publish what runs left in their local spools")
    s.set_defaults(func=cmd_sync)

    s = command("gc", help="delete logged media (images, videos, audio, text) that no event references")
    s.add_argument(
        "--grace-s",
        type=float,
        default=3600.0,
        help="keep unreferenced items younger than this, whose events may be on their way (default 3600)",
    )
    s.add_argument("--dry-run", action="store_true", help="say what would be deleted; delete nothing")
    s.set_defaults(func=cmd_gc)

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
    s.add_argument("runs", nargs="*", metavar="RUN", help="run ids, id prefixes or names")
    s.add_argument("--project", help="every run of this project (with any RUNs named)")
    s.add_argument(
        "--group-by",
        action="append",
        metavar="KEY",
        help="group runs by these config keys (repeatable or comma-separated; nested keys as a/b; "
        "default: every key that differs but seeds)",
    )
    s.add_argument(
        "--baseline",
        help="the run the others are compared with (default: the first), or a group (lr=0.001)",
    )
    s.add_argument("--metric", action="append", help="only these metrics (repeatable; default: all shared)")
    s.add_argument("--window", type=int, help="values in the final window (default: the last tenth, >= 5)")
    s.add_argument(
        "--per-run", action="store_true", help="with groups, also each run against the baseline run"
    )
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
        "--window",
        type=float,
        default=0.0,
        help="take a second lag sample S seconds after the first, for each group's commit rate (default: "
        "one sample; a group's members tell alive from stopped)",
    )
    s.add_argument(
        "--stop-after",
        type=float,
        default=30.0,
        help="a group whose oldest waiting record is older than this, and which has no member or "
        "no consumer that said it runs within this time, is STOP (they say so every 5 s)",
    )
    s.add_argument("--since", type=float, metavar="S", help="read runs from the last S seconds only")
    s.add_argument(
        "--sample",
        action="store_true",
        help="sample the groups here even when the running stack's dashboard can answer at once",
    )
    s.set_defaults(func=cmd_status)

    s = command("dashboard", help="the live web dashboard, /metrics (Prometheus), /healthz and /readyz")
    s.add_argument(
        "--host", default="127.0.0.1", help="address to bind (anything but loopback needs --token)"
    )
    s.add_argument("--port", dest="web_port", type=int, default=8765)
    s.add_argument("--token", help="required on every request (default: $METRICBUS_DASHBOARD_TOKEN)")
    s.add_argument("--since", type=float, metavar="S", help="read runs from the last S seconds only")
    s.add_argument(
        "--rules", help="alert rules run over archived runs' pages and reports (default: the built-in pack)"
    )
    s.add_argument("--config", help="stream config those rules' derived series follow (YAML)")
    s.set_defaults(func=cmd_dashboard)

    s = command("demo", help="embedded stack + a short real PPO run on CartPole, read back from the archive")
    s.add_argument("--updates", type=int, default=30, help="PPO updates (each 512 environment steps)")
    s.add_argument("--port", type=int, help="port of the embedded broker (default 9092)")
    s.set_defaults(func=cmd_demo)
    return p
