"""The ``metricbus`` command: one subcommand per process of the production shape, and the tools.

This room owns the command line: the parser (``_parser``), the commands grouped by what they
touch (``_stack``: start things; ``_consumers``: the long-running consumers; ``_archive``: read
the archive; ``_ops``: status and dashboard), what they share (``_common``: settings that join
the running stack, the run argument, waiting for the broker) and how they log (``_logs``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import NoReturn

from metricbus.schemas import MetricbusError

from ._common import WITHOUT_PANDAS, keep_pandas_out
from ._logs import Printable, Repeats
from ._parser import build_parser
from ._stack import up_consumers

__all__ = ["Repeats", "build_parser", "main", "up_consumers"]


#: commands that only read and print (no writer, no thread left, their clients closed): their
#: console process exits without tearing the interpreter down, which takes ~0.1 s for
#: kafka-python's protocol classes and about as long for pyarrow's, a tenth of such a command
ENDS_AT_ONCE = frozenset({"status", "runs", "health", "compare"})


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``metricbus`` console script."""
    args = build_parser().parse_args(argv)
    if argv is None and os.environ.get("METRICBUS_SUPERVISOR_PID"):  # a child of `metricbus up`
        from metricbus.stack._proc import exit_when_orphaned

        exit_when_orphaned()
    code = _run(args, own_process=argv is None)
    if argv is None and args.command in ENDS_AT_ONCE:
        _end_at_once(code)
    return code


def _end_at_once(code: int) -> NoReturn:
    """Exit now, as a normal exit but for the interpreter's teardown.

    What was printed is flushed and the exit handlers run (logging's); only the collection of
    every module's objects is skipped.
    """
    import atexit

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left (`status | head`), or it is closed
            pass
    atexit._run_exitfuncs()  # noqa: SLF001 - the handlers a normal exit runs (logging's flush)
    os._exit(code)


def _run(args: argparse.Namespace, own_process: bool) -> int:
    """The command ``args`` names, in this process; its exit status."""
    if own_process and args.command in WITHOUT_PANDAS:
        keep_pandas_out()
    root = logging.getLogger()
    if not root.handlers:  # as logging.basicConfig, with a Printable formatter
        console = logging.StreamHandler()
        console.setFormatter(Printable("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        # only on the handler made here: a program that calls main() keeps its own handlers as
        # they were (a filter added to them held back its kafka lines for a minute)
        console.addFilter(Repeats())
        root.addHandler(console)
        root.setLevel(logging.DEBUG if args.verbose else logging.INFO)
    for noisy in ("kafka", "aiokafka", "tensorboard"):  # their chatter is ours to report, once
        logging.getLogger(noisy).setLevel(logging.ERROR if not args.verbose else logging.INFO)
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
