"""Sink consumers: a small runtime and one module per sink (parquet here; more to come)."""

from ._archive import SCHEMA as ARCHIVE_SCHEMA
from ._archive import read_table, run_dir, summary, tidy
from ._dedupe import Deduper, SeqSet
from ._events import Event, decode_events
from ._protocol import Sink
from ._runtime import SinkRunner, SinkStats
from .parquet import ParquetArchive

__all__ = [
    "ARCHIVE_SCHEMA",
    "Deduper",
    "Event",
    "ParquetArchive",
    "SeqSet",
    "Sink",
    "SinkRunner",
    "SinkStats",
    "decode_events",
    "read_table",
    "run_dir",
    "summary",
    "tidy",
]
