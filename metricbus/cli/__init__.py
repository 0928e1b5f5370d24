"""The ``metricbus`` command: one subcommand per process of the production shape, and the tools.

This room owns the command line: the parser (``_parser``), the commands grouped by what they
touch (``_stack``: start things; ``_consumers``: the long-running consumers; ``_archive``: read
the archive; ``_ops``: status and dashboard), what they share (``_common``: settings that join
the running stack, the run argument, waiting for the broker) and how they log (``_logs``).
"""

from __future__ import annotations

import logging
import os
import sys

from metricbus.schemas import MetricbusError

from ._common import WITHOUT_PANDAS, keep_pandas_out
from ._logs import Printable, Repeats
from ._parser import build_parser
from ._stack import up_consumers

__all__ = ["Repeats", "build_parser", "main", "up_consumers"]


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``metricbus`` console script."""
    args = build_parser().parse_args(argv)
    if argv is None and args.command in WITHOUT_PANDAS:  # the console script's own process
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
