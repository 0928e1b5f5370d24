"""What every command shares: settings that join the running stack, the run argument, signals."""

from __future__ import annotations

import argparse
import importlib.abc
import logging
import signal
import sys
import threading
from pathlib import Path

from metricbus.schemas import MetricbusError, Settings

log = logging.getLogger("metricbus")


#: commands that start a stack of their own: they never join a running one
_STARTS_A_STACK = {"up", "broker", "demo"}

#: Commands that read the archive and judge it with numpy: pandas is kept out of their process.
#: pyarrow's dataset module imports pandas at its own import when pandas is installed (0.2 s of
#: a ~1 s `metricbus health`); pyarrow works without it, and nothing these commands do needs it.
WITHOUT_PANDAS = frozenset({"runs", "health", "compare"})


class _NoPandas(importlib.abc.MetaPathFinder):
    """Refuses to import pandas: pyarrow, asking whether pandas is there, hears that it is not."""

    def find_spec(self, fullname: str, path: object = None, target: object = None) -> None:
        if fullname == "pandas" or fullname.startswith("pandas."):
            raise ModuleNotFoundError(f"{fullname} is kept out of this metricbus command", name=fullname)
        return None


def keep_pandas_out() -> None:
    """For a command's own process only (``metricbus <command>``), never a caller's."""
    if "pandas" not in sys.modules and not any(isinstance(f, _NoPandas) for f in sys.meta_path):
        sys.meta_path.insert(0, _NoPandas())


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
    args.joined_stack = stack  # commands that can ask the stack itself (status: its dashboard)
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
    from metricbus.diagnostics._runs import find_run

    return find_run(settings.archive_dir, ref)


def _stop_on_signals() -> threading.Event:
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def _wait_for_broker(settings: Settings, args: argparse.Namespace) -> None:
    from metricbus.schemas import wait_for_broker

    wait_for_broker(settings, args.wait_s, f"metricbus {args.command}")


WAIT_HELP = "no broker yet: wait at most S seconds, then exit 2 (default: no limit)"
