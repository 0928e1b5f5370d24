"""Settings, parsed once at the edge (environment variables and CLI flags) into frozen objects.

Every component takes a :class:`Settings`; none reads the environment itself.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._errors import ConfigError
from ._signing import Signer
from ._stack_file import StackInfo, running_stack

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_COMPRESSIONS = ("zstd", "gzip", "none")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


@dataclasses.dataclass(frozen=True)
class Topics:
    """Names of the topics metricbus uses; all share one prefix."""

    prefix: str = "metricbus."

    @property
    def events(self) -> str:
        """Raw run events (EventBatch records), keyed by run_id."""
        return f"{self.prefix}events"

    @property
    def aggregates(self) -> str:
        """Derived series from the stream jobs, keyed by run_id."""
        return f"{self.prefix}aggregates"

    @property
    def alerts(self) -> str:
        """Alert transitions (firing / resolved), keyed by run_id."""
        return f"{self.prefix}alerts"

    @property
    def deadletter(self) -> str:
        """Records no consumer could process, with the reason in their headers."""
        return f"{self.prefix}deadletter"

    @property
    def alive(self) -> str:
        """Alive stamps: every metricbus consumer says here every few seconds that it runs.

        Keyed by its consumer group (the newest stamp of each group is what counts), so
        ``metricbus status`` tells a group that consumes slowly from one that stopped on any
        broker; the embedded one keeps no commit metadata and lists a member that died.
        """
        return f"{self.prefix}alive"

    @property
    def restarting(self) -> str:
        """A marker that exists only while ``metricbus up`` restarts its embedded broker.

        Created on the old broker once the carry-over has begun (never by ``ensure_topics``):
        a producer whose check finds it holds on to what that broker acknowledged since, and
        sends it again to the new one (``producers._publisher``). Created on the new broker
        too, first, and deleted once the carry is published there: the carried records go
        before the producers' re-sent ones.
        """
        return f"{self.prefix}broker-restarting"

    def carried(self, topic_id: str) -> str:
        """A marker: ``metricbus up`` carried over into the events topic of this id.

        It holds what the broker before held up to its ``restarting`` marker (a planned
        restart). A producer that finds its topic re-created and this marker then sends again only what
        was acknowledged since its last check, not its whole last minute.
        """
        return f"{self.prefix}broker-carried-{topic_id}"

    def all(self) -> tuple[str, ...]:
        """Every topic, in creation order (not the markers)."""
        return (self.events, self.aggregates, self.alerts, self.deadletter, self.alive)


@dataclasses.dataclass(frozen=True)
class Groups:
    """Names of the consumer groups metricbus uses; all share the topics' prefix."""

    prefix: str = "metricbus."

    def sink(self, kind: str) -> str:
        """The group of a sink (``parquet``, ``tensorboard``, ``wandb``): its instances share it."""
        return f"{self.sink_prefix}{kind}"

    @property
    def sink_prefix(self) -> str:
        """What every sink's group name starts with."""
        return f"{self.prefix}sink."

    def alerts(self, name: str) -> str:
        """The group of an alert deliverer (``console``, ``webhook``, ``wandb``, or a name of the user's)."""
        return f"{self.prefix}alerts.{name}"

    @property
    def stream(self) -> str:
        """The stream workers' group (Faust's app id)."""
        return f"{self.prefix}stream"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Where metricbus finds Kafka and keeps its files.

    Build one with :meth:`from_env` (``METRICBUS_*`` variables) and ``dataclasses.replace``
    for flags. Secrets are excluded from ``repr`` so a logged Settings never shows them.
    """

    #: Kafka bootstrap servers ("host:port,host:port"); None means the local embedded stack.
    bootstrap: str | None = None
    #: Port of the embedded broker (``metricbus broker`` / ``metricbus up``) on 127.0.0.1.
    local_port: int = 9092
    #: Prefix of every topic name.
    topic_prefix: str = "metricbus."
    #: Root of the spool (``spool/``), the Parquet archive (``archive/``) and state files.
    data_dir: Path = dataclasses.field(default_factory=lambda: Path.home() / ".metricbus")
    #: Never contact a broker: runs spool locally and ``metricbus sync`` publishes them later.
    offline: bool = False
    #: Partitions of the events topic when metricbus creates it.
    partitions: int = 4
    #: Consumer-group timeouts. Short by default for the local broker, whose group join
    #: completes only after the rebalance timeout; raise them for a real cluster.
    session_timeout_ms: int = 6000
    rebalance_timeout_ms: int = 3000
    heartbeat_interval_ms: int = 1000
    #: Longest time a consumer's fetch may wait at the broker for new data. Short because the
    #: embedded broker holds a fetch this long whenever any partition in it has nothing new,
    #: even while another has plenty (measured: a consumer of a full partition and an empty one
    #: got 20 records per 1.5 s); Kafka answers as soon as data is there, so short only costs
    #: a few idle polls a second.
    fetch_max_wait_ms: int = 100
    #: The same for the stream worker, which stands between log() and every derived point and
    #: alert: on the embedded broker a fetch that finds nothing new waits about this long for
    #: what comes next (measured, log() -> derived point p99: 82 ms at 100, 45 ms at 50). Each
    #: halving doubles the busy worker's polls (~10 ms of CPU a second each for it and the broker).
    worker_fetch_max_wait_ms: int = 50
    #: A stream worker, sink, alert consumer or dashboard that has read nothing for
    #: ``IDLE_AFTER_S`` (2 s) waits this long per fetch instead, until its next record: an idle
    #: stack on the short waits asks the broker dozens of times a second (measured, an idle
    #: ``up`` over 20 s: 11 % of a core, 17 % with the worker on its short wait). On the embedded
    #: broker the first record after a quiet spell can come up to this much later; Kafka answers
    #: at once. From that record on, the short waits again.
    idle_fetch_max_wait_ms: int = 500
    #: Seconds between checkpoints of the stream worker's state (0: never); a restarted worker
    #: replays the events topic only from its last checkpoint.
    checkpoint_interval_s: float = 60.0
    #: Where the stream workers keep one checkpoint per partition (default ``<data dir>/stream``).
    #: Workers of one group on several machines need a directory they all read: a shared volume.
    checkpoint_dir: Path | None = None
    #: Resident memory (MB) past which ``metricbus up`` restarts its memory-only embedded
    #: broker (it keeps every record and has no retention: about 1.1 MB of memory per MB
    #: produced), carrying over what the consumers have not read (docs: the local stack). 0: never.
    broker_max_mb: float = 1024.0
    #: Size (MB) of the media store (``<data dir>/media``: the bytes of logged images, videos,
    #: audio and text) past which new media are refused, counted and said once; scalars go on.
    media_max_mb: float = 10240.0
    #: Where the media store is (default ``<data dir>/media``). Training jobs on other machines
    #: than the sinks and the dashboard need one directory they all reach: a shared volume.
    media_dir: Path | None = None
    #: How training jobs compress what they send: ``zstd`` (Kafka 2.1 and later), ``gzip`` or
    #: ``none``. zstd holds the embedded broker to about a third of the memory per event
    #: (bench/producer_overhead.py measures it); consumers decompress.
    compression: str = "zstd"
    #: Kafka's ``security.protocol``: PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
    security_protocol: str = "PLAINTEXT"
    #: With SASL: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512.
    sasl_mechanism: str | None = None
    #: With SASL: the user name.
    sasl_username: str | None = None
    #: With SASL: the password (never printed nor logged).
    sasl_password: str | None = dataclasses.field(default=None, repr=False)
    #: With SSL: the CA bundle that signs the brokers' certificates.
    ssl_cafile: str | None = None
    #: With SSL client authentication: this client's certificate and key.
    ssl_certfile: str | None = None
    ssl_keyfile: str | None = None
    #: A secret shared by the project's training jobs and consumers: producers sign each events
    #: record with an HMAC-SHA256 under it, and the stream worker, the sinks and the dashboard
    #: refuse (dead-letter) any record without a matching one (never printed nor logged).
    signing_key: str | None = dataclasses.field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.security_protocol not in _PROTOCOLS:
            raise ConfigError(
                f"METRICBUS_SECURITY_PROTOCOL={self.security_protocol!r} is not one of "
                f"{', '.join(_PROTOCOLS)}."
            )
        if self.security_protocol.startswith("SASL"):
            if self.sasl_mechanism not in _MECHANISMS:
                raise ConfigError(
                    f"{self.security_protocol} needs METRICBUS_SASL_MECHANISM set to one of "
                    f"{', '.join(_MECHANISMS)} (got {self.sasl_mechanism!r})."
                )
            if not self.sasl_username or self.sasl_password is None:
                raise ConfigError(
                    f"{self.security_protocol} needs METRICBUS_SASL_USERNAME and METRICBUS_SASL_PASSWORD."
                )
        if not 0 < self.local_port < 65536:
            raise ConfigError(f"local port {self.local_port} is not a TCP port (1-65535).")
        if self.compression not in _COMPRESSIONS:
            raise ConfigError(
                f"METRICBUS_COMPRESSION={self.compression!r} is not one of {', '.join(_COMPRESSIONS)}."
            )
        if self.partitions < 1:
            raise ConfigError(f"partitions must be at least 1 (got {self.partitions}).")

    @classmethod
    def from_env(
        cls, env: Mapping[str, str] | None = None, discover: bool = True, **overrides: Any
    ) -> Settings:
        """Read ``METRICBUS_*`` variables; keyword overrides (from CLI flags) win.

        With no broker given (``bootstrap`` nor ``local_port``), the running ``metricbus up``
        supplies it, and the data directory and prefix where those are not given either
        (:func:`resolve`); ``discover=False`` never looks (``up`` itself, its children).
        """
        return cls.resolve(env, discover, **overrides)[0]

    @classmethod
    def resolve(
        cls, env: Mapping[str, str] | None = None, discover: bool = True, **overrides: Any
    ) -> tuple[Settings, StackInfo | None]:
        """:meth:`from_env`, and the running stack it joined (None when it joined none)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(f"METRICBUS_{field.name.upper()}")
            if raw is None or raw == "":
                continue
            values[field.name] = _parse(field.name, field.type, raw)
        values.update({k: v for k, v in overrides.items() if v is not None})
        stack = None
        if discover and not values.get("offline") and not {"bootstrap", "local_port"} & values.keys():
            stack = running_stack(values.get("data_dir"))
            if stack is not None:
                if stack.bootstrap:
                    values["bootstrap"] = stack.bootstrap
                else:
                    values["local_port"] = stack.local_port
                values.setdefault("data_dir", Path(stack.data_dir))
                values.setdefault("topic_prefix", stack.topic_prefix)
        return cls(**values), stack

    def to_env(self) -> dict[str, str]:
        """``METRICBUS_*`` variables from which :meth:`from_env` rebuilds these settings.

        For child processes; it contains secrets, so never print it.
        """
        out = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                out[f"METRICBUS_{field.name.upper()}"] = str(int(value) if isinstance(value, bool) else value)
        return out

    @property
    def signer(self) -> Signer:
        """Signs and checks events records with ``signing_key`` (does neither without one)."""
        return Signer(self.signing_key)

    @property
    def compression_type(self) -> str | None:
        """``compression`` as the Kafka clients' ``compression_type`` (None: uncompressed)."""
        return None if self.compression == "none" else self.compression

    @property
    def is_local(self) -> bool:
        """True when no cluster is configured and the embedded stack is the broker."""
        return self.bootstrap is None

    @property
    def bootstrap_servers(self) -> str:
        """The bootstrap string clients connect to."""
        return self.bootstrap or f"127.0.0.1:{self.local_port}"

    @property
    def topics(self) -> Topics:
        """The topic names under this settings' prefix."""
        return Topics(self.topic_prefix)

    @property
    def groups(self) -> Groups:
        """The consumer-group names under this settings' prefix."""
        return Groups(self.topic_prefix)

    @property
    def spool_dir(self) -> Path:
        """Where producers keep what they could not publish yet."""
        return Path(self.data_dir) / "spool"

    @property
    def archive_dir(self) -> Path:
        """Root of the Parquet archive."""
        return Path(self.data_dir) / "archive"

    @property
    def media_root(self) -> Path:
        """Root of the media store (content-addressed bytes of logged media)."""
        return Path(self.media_dir) if self.media_dir is not None else Path(self.data_dir) / "media"


def _parse(name: str, type_: Any, raw: str) -> Any:
    text = str(type_)
    try:
        if "bool" in text:
            if raw.lower() in {"1", "true", "yes", "on"}:
                return True
            if raw.lower() in {"0", "false", "no", "off"}:
                return False
            raise ValueError(raw)
        if "int" in text:
            return int(raw)
        if "float" in text:
            return float(raw)
        if "Path" in text:
            return Path(raw).expanduser()
    except ValueError:
        kind = "true/false" if "bool" in text else "a number" if "float" in text else "an integer"
        raise ConfigError(f"METRICBUS_{name.upper()}={raw!r} is not {kind}.") from None
    return raw
