"""Diagnostics: what a run's archived events say about it.

This room owns run health, 0-100 with its evidence (``_health``), comparison of runs with
significance (``_compare``), the self-contained HTML report (``_report``) and the view of a
run's logged scalars per metric and label that all three read (``_series``; straight from the
archive's columns for health and compare: ``_columnar``), finding a run by id, prefix or name
and the one-row-per-run table (``_runs``), and back-tests of alert rules on an archived run
(``_backtest``). Everything here
reads the Parquet archive (the durable record); nothing here needs a running stack.
"""

from ._columnar import read_logged
from ._compare import compare_series
from ._health import assess, dead_letters_of, judge
from ._report import build, read_run

__all__ = ["assess", "build", "compare_series", "dead_letters_of", "judge", "read_logged", "read_run"]
