"""The wire contract of metricbus, and the plumbing every component shares.

Public names only; implementation lives in the private modules. Depends on nothing else of
ours: producers, stream_jobs, sinks and the metricbus face all build on it.
"""

from ._bodies import run_started
from ._codec import HEADER_SIZE, MAGIC, Codec, default_codec
from ._deadletter import DeadLetter, dead_letter
from ._dedupe import Deduper, Interval, SeqSet
from ._errors import (
    BadMagicError,
    BrokerError,
    ConfigError,
    EncodeError,
    InvalidNameError,
    MetricbusError,
    MetricValueError,
    PortInUseError,
    SchemaError,
    TruncatedRecordError,
    UnknownSchemaError,
    UnsafeRecordError,
)
from ._events import (
    DERIVED_PRODUCER,
    HEARTBEAT,
    HISTOGRAM,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    TABLE,
    DerivedRecord,
    Event,
    decode_aggregates,
    decode_events,
    derived_event_count,
    encode_aggregates,
    encode_event,
    encode_events,
)
from ._files import Ledger, atomic_write, fsync_dir
from ._kafka import (
    MAX_RECORD_BYTES,
    client_options,
    consumer_group_options,
    ensure_topics,
    fetch_options,
    make_consumer,
    make_producer,
    ssl_context,
)
from ._names import check_run_id, checked_ids, path_segment
from ._registry import SCHEMA_DIR, SchemaVersion, crc64_avro, load_versions
from ._settings import Settings, Topics
from ._telemetry import LoopMetrics, count_restart, multiprocess_dir

__all__ = [
    "HEADER_SIZE",
    "HEARTBEAT",
    "HISTOGRAM",
    "MAGIC",
    "MAX_RECORD_BYTES",
    "METRICS",
    "RUN_FINISHED",
    "RUN_STARTED",
    "SCHEMA_DIR",
    "TABLE",
    "DERIVED_PRODUCER",
    "BadMagicError",
    "BrokerError",
    "Codec",
    "ConfigError",
    "DeadLetter",
    "Deduper",
    "DerivedRecord",
    "Ledger",
    "LoopMetrics",
    "count_restart",
    "multiprocess_dir",
    "Event",
    "Interval",
    "SeqSet",
    "EncodeError",
    "InvalidNameError",
    "MetricValueError",
    "MetricbusError",
    "PortInUseError",
    "SchemaError",
    "SchemaVersion",
    "Settings",
    "Topics",
    "TruncatedRecordError",
    "UnsafeRecordError",
    "checked_ids",
    "UnknownSchemaError",
    "check_run_id",
    "client_options",
    "consumer_group_options",
    "fetch_options",
    "atomic_write",
    "crc64_avro",
    "dead_letter",
    "make_consumer",
    "make_producer",
    "derived_event_count",
    "encode_aggregates",
    "encode_event",
    "encode_events",
    "fsync_dir",
    "decode_aggregates",
    "decode_events",
    "default_codec",
    "ensure_topics",
    "load_versions",
    "path_segment",
    "run_started",
    "ssl_context",
]
