"""``metricbus up``: the embedded broker, the topics and every consumer process, supervised.

Children are separate processes (one per sink, the stream worker, the console alerts),
each in its own session so a Ctrl-C reaches only ``up``, which stops them in order:
consumers first (they flush and commit), the broker last. A child that exits with an error
within ``startup_s`` of starting cannot start (a bad rules file, a missing extra): ``up``
stops with that child's own error. One that dies later is restarted with backoff, and each
restart is reported on the terminal with the last lines of its log. Children also get
SIGTERM if this process dies (PDEATHSIG).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from metricbus.schemas import (
    MetricbusError,
    Settings,
    count_restart,
    ensure_topics,
    mark_broker_restarting,
    mark_carried_over,
    unmark_broker_restarting,
)
from metricbus.stack import _proc
from metricbus.stack._broker import EmbeddedBroker
from metricbus.stack._echo import AlertEcho

if TYPE_CHECKING:
    from metricbus.ops._lag import PartitionLag
    from metricbus.stack._restart import Placed, Unread

log = logging.getLogger("metricbus.up")
#: Seconds between looks at the embedded broker's memory.
MEMORY_CHECK_S = 10.0
#: Seconds before a put-off planned restart is tried again.
MEMORY_RETRY_S = 60.0
#: After a planned restart, the next waits until every group that had committed before it
#: has committed on the new broker (its consumer is back), for at most this long: a group
#: whose consumer is gone for good (a one-off alerts consumer) does not hold it forever.
GROUPS_BACK_S = 300.0

#: Consumer processes `up` runs: name -> CLI arguments after `metricbus`.
#: Optional ones run only when their extra is installed (see OPTIONAL).
CONSUMERS: dict[str, list[str]] = {
    "sink-parquet": ["sink", "parquet"],
    "sink-tensorboard": ["sink", "tensorboard"],
    "sink-wandb": ["sink", "wandb"],
    "stream-worker": ["worker"],
    "alerts-console": ["alerts", "--console"],
    "dashboard": ["dashboard"],
}
#: Consumer -> the module it needs; without it `up` says how to install it and skips it.
OPTIONAL = {"sink-tensorboard": "tensorboard", "sink-wandb": "wandb", "dashboard": "starlette"}
#: Where `up` serves the dashboard unless told otherwise, or this data dir's last port.
DASHBOARD_PORT = 8765
#: The file in the data dir that keeps the dashboard's port across restarts (its links hold).
PORT_FILE = "dashboard.port"


def free(port: int) -> bool:
    """Whether nothing listens on 127.0.0.1:``port`` (it can be bound now)."""
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def dashboard_port(wanted: int | None, data_dir: Path | None = None, taken: Collection[int] = ()) -> int:
    """The dashboard's port, kept in ``<data dir>/dashboard.port``: a run's printed link holds.

    ``wanted``, else the port this data dir's dashboard had last, else DASHBOARD_PORT, else a
    free one; never one of ``taken`` (the broker's).
    """
    import socket

    remembered = _remembered(data_dir)
    if wanted:
        port = wanted
    else:
        tried = [p for p in (remembered, DASHBOARD_PORT) if p and p not in taken]
        port = next((p for p in tried if free(p)), 0)
        if not port:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            log.warning("port %d is in use: the dashboard takes %d", remembered or DASHBOARD_PORT, port)
    if data_dir is not None and port != remembered:
        try:
            Path(data_dir).mkdir(parents=True, exist_ok=True)
            (Path(data_dir) / PORT_FILE).write_text(f"{port}\n")
        except OSError as exc:
            log.warning("cannot keep the dashboard's port in %s (%s)", data_dir, exc)
    return port


def _remembered(data_dir: Path | None) -> int | None:
    if data_dir is None:
        return None
    try:
        port = int((Path(data_dir) / PORT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return port if 0 < port < 65536 else None


def available_consumers() -> dict[str, list[str]]:
    """CONSUMERS whose optional dependencies are importable (the others are named in a log line)."""
    import importlib.util

    out = {}
    for name, argv in CONSUMERS.items():
        module = OPTIONAL.get(name)
        if module is not None and importlib.util.find_spec(module) is None:
            log.warning("%s is not started: pip install 'metricbus[%s]'", name, module)
            continue
        out[name] = argv
    return out


@dataclasses.dataclass
class _Child:
    name: str
    argv: list[str]
    log_path: Path
    proc: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    next_start: float = 0.0
    started: float = 0.0
    ever_ran: bool = False  #: it outlived ``startup_s`` once


def _commits(lags: list[PartitionLag]) -> dict[tuple[str, int], int | None]:
    """A group's committed offset per (topic, partition)."""
    return {(lag.topic, lag.partition): lag.committed for lag in lags}


class Stack:
    """Broker (when local) + topics + consumer processes. start() / run_until(event) / stop()."""

    def __init__(
        self,
        settings: Settings,
        consumers: dict[str, list[str]] | None = None,
        startup_s: float = 8.0,
        report: Callable[[str], None] | None = None,
    ) -> None:
        self.settings = settings
        self.startup_s = startup_s
        #: where restarts are reported for a person (``up`` prints them on stderr)
        self.report = report or (lambda line: print(line, file=sys.stderr, flush=True))
        self.log_dir = Path(settings.data_dir) / "logs"
        self.broker = (
            EmbeddedBroker(settings.local_port, log_path=self.log_dir / "broker.log", report=self.report)
            if settings.is_local
            else None
        )
        env = {**os.environ, **settings.to_env()}
        #: one directory where every child's prometheus_client writes its samples; the
        #: dashboard serves them all on /metrics (cleared at each start: counters begin at 0)
        self.metrics_dir = Path(
            os.environ.get("PROMETHEUS_MULTIPROC_DIR") or Path(settings.data_dir) / "prometheus"
        )
        env["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)
        self._env = env
        consumers = dict(available_consumers() if consumers is None else consumers)
        self._check_ports(consumers)
        if "dashboard" in consumers and "--port" not in consumers["dashboard"]:
            taken = [settings.local_port] if settings.is_local else []
            port = dashboard_port(None, Path(settings.data_dir), taken)
            consumers["dashboard"] = [*consumers["dashboard"], "--port", str(port)]
        self.children = [
            _Child(name, [sys.executable, "-m", "metricbus", *args], self.log_dir / f"{name}.log")
            for name, args in consumers.items()
        ]
        self._stopped = threading.Event()
        self.broker_restarts = 0
        self._broker_next_start = 0.0
        self.planned_restarts = 0  #: broker restarts to bound its memory (broker_max_mb)
        self.broker_rss_mb = 0.0
        self._memory_next_check = 0.0
        self._memory_retry_at = 0.0
        self._memory_said = ""  #: the last put-off reason said, its numbers aside
        #: the groups that had committed before the last planned restart, and until when the
        #: next waits for them to commit on the new broker
        self._groups_before: set[str] = set()
        self._groups_wait_until = 0.0
        #: per group, the positions the last planned restart committed for it on the new broker
        self._recommitted: dict[str, dict[tuple[str, int], int]] = {}
        #: the console consumer's alerts, said on this terminal too
        self._echo = AlertEcho(self.log_dir / "alerts-console.log", settings.archive_dir, self.report)

    def _check_ports(self, consumers: dict[str, list[str]]) -> None:
        """Refuse, before anything starts, ports that clash or are in use: one clear line each."""
        argv = consumers.get("dashboard", [])
        web = int(argv[argv.index("--port") + 1]) if "--port" in argv else None
        broker = self.settings.local_port if self.settings.is_local else None
        if broker is not None and web == broker:
            raise MetricbusError(
                f"--port {broker} is the embedded broker's and --dashboard-port {web} the dashboard's: "
                "give them different ports"
            )
        if broker is not None and not free(broker):
            raise MetricbusError(
                f"port {broker} is in use: the embedded broker needs a free port (--port P; the "
                "dashboard's is --dashboard-port), or point at the broker that listens there "
                f"with --bootstrap 127.0.0.1:{broker}"
            )
        if web is not None and not free(web):
            raise MetricbusError(f"port {web} is in use: give the dashboard another (--dashboard-port P)")

    def start(self) -> Stack:
        """Start the broker, create the topics, start every consumer."""
        import shutil

        if self.metrics_dir.is_dir() and "PROMETHEUS_MULTIPROC_DIR" not in os.environ:
            shutil.rmtree(self.metrics_dir, ignore_errors=True)  # ours: samples of a previous stack
        self.metrics_dir.mkdir(parents=True, exist_ok=True)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(self.metrics_dir)  # our own restart counter
        for name in [c.name for c in self.children] + ["broker", "broker (planned)"]:
            count_restart(name, 0)  # the sample and its file exist now: a full disk later is no SIGBUS
        if self.broker is not None:
            self.broker.start()
        ensure_topics(self.settings)
        for child in self.children:
            self._start(child)
        return self

    def _start(self, child: _Child) -> None:
        child.proc = _proc.spawn(child.argv, log_path=child.log_path, env=self._env, report=self.report)
        child.started = time.monotonic()

    def supervise_once(self) -> None:
        """Restart any consumer that exited (backoff 1s, doubling to 30s), saying so.

        Raises MetricbusError, with the child's last log lines, when a child that never got
        past its start-up exits with an error: it would only fail the same way again.
        """
        now = time.monotonic()
        self._echo.poll()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None and now - child.started >= self.startup_s:
                child.ever_ran = True
            if child.proc is not None and child.proc.poll() is not None and not self._stopped.is_set():
                code = child.proc.returncode
                last = _proc.tail(child.log_path, proc=child.proc)
                child.proc = None
                if code != 0 and not child.ever_ran:
                    raise MetricbusError(
                        f"{child.name} cannot start (exit code {code}); the end of {child.log_path}:\n{last}"
                    )
                child.restarts += 1
                count_restart(child.name)
                delay = min(2 ** (child.restarts - 1), 30)
                child.next_start = now + delay
                log.error(
                    "%s exited with code %s; restarting in %ds (log: %s)",
                    child.name,
                    code,
                    delay,
                    child.log_path,
                )
                self.report(
                    f"metricbus up: {child.name} exited with code {code} "
                    f"(restart {child.restarts}, in {delay}s); the end of {child.log_path}:\n{last}"
                )
            if child.proc is None and now >= child.next_start and not self._stopped.is_set():
                self._start(child)
        broker = self.broker
        if (
            broker is not None
            and broker.proc is not None
            and broker.proc.poll() is not None
            and not self._stopped.is_set()
            and now >= self._broker_next_start
        ):
            self._restart_broker(broker, now)
        elif broker is not None and not self._stopped.is_set():
            self._watch_broker_memory(broker, now)

    def _watch_broker_memory(self, broker: EmbeddedBroker, now: float) -> None:
        """Restart the broker on purpose past ``broker_max_mb`` of resident memory.

        Its memory is every record ever produced (no retention, no DeleteRecords).
        """
        limit = self.settings.broker_max_mb
        if not limit or now < self._memory_next_check or broker.proc is None:
            return
        self._memory_next_check = now + MEMORY_CHECK_S
        try:
            rss = psutil.Process(broker.proc.pid).memory_info().rss / 1e6
        except psutil.Error:
            return
        self.broker_rss_mb = rss
        if rss <= limit:
            self._memory_said = ""
            return
        if now < self._memory_retry_at:
            return
        behind = self._far_behind(rss)
        if behind:
            self._put_off(rss, behind, now)
            return
        self._planned_restart(broker, rss, now)

    def _put_off(self, rss_mb: float, why: str, now: float) -> None:
        """Say why the restart waits: once per reason (its numbers aside), so a change of reason shows."""
        self._memory_retry_at = now + MEMORY_RETRY_S
        reason = re.sub(r"\d+", "#", why)
        if self._memory_said != reason:
            self._memory_said = reason
            self.report(
                f"metricbus up: the embedded broker holds {rss_mb:.0f} MB (over METRICBUS_BROKER_MAX_MB="
                f"{self.settings.broker_max_mb:.0f}); its restart is put off: {why}"
            )

    def _far_behind(self, rss_mb: float) -> str:
        """Why a restart now would free little or cannot be planned ('' when it can).

        Judged before the consumers are stopped, from their commits: a restart must free at
        least half of ``broker_max_mb``, and what the slowest consumer has not read (its share
        of the events topic's records, of ``rss_mb``) is carried over. A consumer slower than
        the training jobs thus holds the broker at its backlog plus that half, not at the bound:
        the restarts go on freeing what everyone has read.
        """
        from metricbus.stack._restart import committed

        try:
            positions = committed(self.settings)
        except RuntimeError as exc:
            return f"cannot read the consumer groups ({exc})"
        from metricbus.sinks._catchup import pending_groups

        leavable = self._leavable(positions, pending_groups(self.settings))
        missing = sorted(
            group
            for group in self._groups_before - leavable  # a sink left behind catches up from the archive
            # no commit on the new broker yet, or still the one `up` made there
            if group not in positions or self._recommitted.get(group) == _commits(positions[group])
        )
        if missing and time.monotonic() < self._groups_wait_until:
            # each would lose what it had not read: the carry goes by the groups' commits
            return f"not every consumer is back on the restarted broker yet ({', '.join(missing)})"
        from metricbus.stack._restart import unread_records

        events = self.settings.topics.events
        leave = self._leave_behind(positions, rss_mb)
        unread, total, behind = unread_records(positions, events, leave)
        if total and not self._frees(rss_mb)(unread, total):
            slowest = max((g for g in behind if g not in leave), key=lambda g: behind[g])
            return (
                f"the consumers have {unread} of the {total} records of {events} still to read, "
                f"most of them {slowest} ({behind[slowest]}): a restart would free little (a consumer "
                "that stays this far behind is slower than the training jobs: `up --sink-instances N` "
                "shares each sink's partitions among N processes, given the cores)"
            )
        return ""

    def _frees(self, rss_mb: float) -> Callable[[int, int], bool]:
        """Whether a restart would free half the bound, carrying ``unread`` of the ``total`` records."""
        half = self.settings.broker_max_mb / 2
        return lambda unread, total: not total or rss_mb * (1 - unread / total) >= half

    def _leavable(self, positions: dict[str, list[PartitionLag]], pending: set[str]) -> set[str]:
        """The groups a planned restart may leave behind: sinks, while the archive sink runs.

        What a group left behind had not read is below every other group's commit, so below
        the archive sink's, which commits only what it flushed: the archive holds it.
        """
        from metricbus.sinks import ParquetArchive

        prefix = self.settings.groups.sink_prefix
        archive = self.settings.groups.sink(ParquetArchive.name)
        if archive not in positions:
            return set()
        groups = set(positions) | self._groups_before | pending
        return {g for g in groups if g.startswith(prefix) and g != archive}

    def _leave_behind(self, positions: dict[str, list[PartitionLag]], rss_mb: float) -> set[str]:
        """The sink groups the next planned restart leaves behind to catch up from the archive.

        Those not back since the last restart, or still catching up; then, while a restart
        would free too little, the one furthest behind (``_carry.leave_behind``).
        """
        from metricbus.sinks._catchup import pending_groups
        from metricbus.stack._restart import leave_behind

        pending = pending_groups(self.settings)
        leavable = self._leavable(positions, pending)
        must = {
            g
            for g in leavable
            if g in pending or g not in positions or self._recommitted.get(g) == _commits(positions[g])
        }
        return leave_behind(positions, self.settings.topics.events, leavable, must, self._frees(rss_mb))

    def _holes(
        self, positions: dict[str, list[PartitionLag]], leave: set[str]
    ) -> dict[str, dict[str, dict[int, int]]]:
        """Per group left behind, per topic and partition, where it had read to (none: the start)."""
        holes: dict[str, dict[str, dict[int, int]]] = {g: {} for g in leave}
        for group in leave & set(positions):
            for lag in positions[group]:
                if lag.committed is not None:
                    holes[group].setdefault(lag.topic, {})[lag.partition] = lag.committed
        return holes

    def _planned_restart(self, broker: EmbeddedBroker, rss_mb: float, now: float) -> None:
        """Restart the broker empty, carrying over what the consumers have not read.

        The consumers stop first (they flush, commit and checkpoint); the records any of them
        still needs are read (``_carry``), the broker restarts, they are published again, the
        stream checkpoints are rebased on the new topic, and the consumers start again.
        """
        from metricbus.stack._restart import Unread, committed, oldest_needed, publish, stored_mb
        from metricbus.stream_jobs import checkpoint_dir, group_id, offsets, rebase

        limit = self.settings.broker_max_mb
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()
        for child in self.children:
            if child.proc is not None:
                _proc.stop(child.proc, 30.0)
                child.proc = None
        self.report(
            f"metricbus up: the embedded broker holds {rss_mb:.0f} MB (METRICBUS_BROKER_MAX_MB="
            f"{limit:.0f}): restarting it to free that memory (planned; what some consumer has not "
            "read yet is carried over, consumers drop what they already hold)"
        )
        checkpoints = checkpoint_dir(self.settings, group_id(self.settings))
        carry: Unread | None = None
        why = ""
        groups: set[str] = set()
        leave: set[str] = set()
        try:
            positions = committed(self.settings)
            groups = set(positions)
            leave = self._leave_behind(positions, rss_mb)
            needed = {g: lags for g, lags in positions.items() if g not in leave}
            carry = Unread(
                self.settings,
                oldest_needed(self.settings, offsets(checkpoints), needed),
                self._holes(positions, leave),
            )
            carry.read()
        except Exception as exc:  # noqa: BLE001 - no restart without knowing what to carry
            why = f"cannot read what the consumers still need ({exc})"
        records = carry.records if carry is not None else []
        carried = stored_mb(self.settings, records)
        if rss_mb - carried < limit / 2:  # a restart would free little; the consumers catch up first
            why = f"what the consumers still need would take {carried:.0f} of its {rss_mb:.0f} MB again"
        if why:
            self._memory_said = ""
            self._put_off(rss_mb, why, now)
            for child in self.children:
                self._start(child)
            return
        assert carry is not None  # else `why` says why not
        try:  # from here producers hold what the old broker acknowledges, for the new one
            mark_broker_restarting(self.settings)
            carry.read(passes=1)  # what producers saw confirmed before the marker
        except Exception as exc:  # noqa: BLE001 - the restart goes on: live producers resend their last minute
            log.warning("planned broker restart: the last read before it failed (%s)", exc)
        records = carry.records
        self._left_behind(carry)
        moved: dict[int, int] = {}  # the stream checkpoints' offsets on the new broker
        broker.stop()
        try:
            for attempt in range(20):  # the port may linger a moment after the old broker exits
                try:
                    broker.start()
                    break
                except MetricbusError:
                    if attempt == 19:
                        raise
                    time.sleep(0.5)
            # Producers hold what they send on the new broker too until the carry is in, so that
            # the carry goes before their re-sent last minute: a consumer reads every partition in
            # seq order (in a soak the W&B sink read the re-sent minute, then a carried backlog
            # of 400,000 events, and meanwhile its highest seq stood 400,000 above what it held).
            mark_broker_restarting(self.settings)
            ensure_topics(self.settings)
            placed = publish(self.settings, records)
            carried_over = True
            moved = self._resume_groups(placed, positions, offsets(checkpoints), leave)
            self._mark_carried_over()
        except Exception as exc:  # noqa: BLE001 - `up` goes on: the consumers start, the broker is watched
            carried_over = False
            self._recommitted = {}
            log.exception("the planned broker restart failed")
            self.report(
                f"metricbus up: the planned broker restart failed ({type(exc).__name__}: {exc}); "
                f"{len(records)} records the consumers had not read may be lost (live training jobs "
                "send their last minute again). The consumers start again; a broker that is not "
                "running is restarted as after a crash."
            )
        if broker.proc is not None and broker.proc.poll() is None:
            self._unmark_restarting()
        rebased = rebase(checkpoints, moved)  # the old broker is gone either way: its offsets with it
        self._groups_before, self._groups_wait_until = groups, time.monotonic() + GROUPS_BACK_S
        for child in self.children:
            self._start(child)
        self.planned_restarts += 1
        self._memory_said = ""
        count_restart("broker (planned)")
        log.warning(
            "planned broker restart %d %s (it held %.0f MB); %d records carried; groups resuming "
            "where they were: %s; stream checkpoints rebased: %s (at %s)",
            self.planned_restarts,
            "done" if carried_over else "failed",
            rss_mb,
            len(records) if carried_over else 0,
            ", ".join(sorted(self._recommitted)) or "none",
            rebased,
            moved or "0",
        )

    def _left_behind(self, carry: Unread) -> None:
        """Record, for each sink group left behind, the runs it catches up on from the archive."""
        from metricbus.sinks._catchup import add_runs

        for group, runs in sorted(carry.hole_runs.items()):
            try:
                add_runs(self.settings, group, runs)
            except OSError as exc:
                log.error("planned broker restart: %s's catch-up list not written (%s)", group, exc)
                self.report(
                    f"metricbus up: {group} was left behind by the planned broker restart, and the "
                    f"list of runs it catches up on could not be written ({exc}): `metricbus replay` "
                    f"them into it ({', '.join(sorted(runs)[:5])}{', ...' if len(runs) > 5 else ''})"
                )
                continue
            log.warning(
                "planned broker restart: %s left behind; it catches up on %d run(s) from the archive",
                group,
                len(runs),
            )
            self.report(
                f"metricbus up: {group} is left behind by the planned broker restart (gone, or too "
                f"far behind to carry its backlog): it catches up on {len(runs)} run(s) from the archive"
            )

    def _resume_groups(
        self,
        placed: Placed,
        positions: dict[str, list[PartitionLag]],
        checkpoints: dict[int, int],
        leave: set[str],
    ) -> dict[int, int]:
        """Commit for each group where it resumes on the new broker; the checkpoints' offsets there.

        A group that had read what another still needed does not read it again (in a soak every
        consumer re-read the slow W&B sink's carried backlog after each restart, the archive
        sink 1.88M duplicates in one process, on a 2-core machine the W&B sink shares). A group
        whose commits are still the ones this made at the last restart is not back: it gets none
        (as on a new broker; when it comes back it reads from the start, dropping what it holds),
        so a consumer gone for good does not hold records across every restart after.
        Nothing is committed when this fails: every group reads from the start.
        """
        from metricbus.stack._restart import commit, end_offsets, resume_at

        back = {
            group: lags
            for group, lags in positions.items()
            if self._recommitted.get(group) != _commits(lags) and group not in leave
        }
        try:
            ends = end_offsets(self.settings, placed)
            resume = resume_at(placed, back, ends)
            commit(self.settings, resume)
        except Exception as exc:  # noqa: BLE001 - the consumers read the new topics whole instead
            log.warning(
                "planned broker restart: the groups' positions on the new broker not committed (%s)", exc
            )
            self._recommitted = {}
            return {}
        self._recommitted = resume
        events = self.settings.topics.events
        moved = {}
        for partition, offset in checkpoints.items():
            key = (events, partition)
            at = placed.position(events, partition, offset, ends[key]) if key in ends else None
            if at is not None:
                moved[partition] = at
        return moved

    def _mark_carried_over(self) -> None:
        """Tell the producers their records up to their last check are on the new broker.

        They then send again only what was acknowledged since (``producers._publisher``); without
        the marker, their whole last minute (safe, and every consumer reads it twice).
        """
        try:
            mark_carried_over(self.settings)
        except MetricbusError as exc:
            log.warning("planned broker restart: producers will send their last minute again (%s)", exc)

    def _unmark_restarting(self) -> None:
        """Let the producers send to the restarted broker (they hold while its marker exists)."""
        error: MetricbusError | None = None
        for attempt in range(5):
            try:
                unmark_broker_restarting(self.settings)
                return
            except MetricbusError as exc:
                error = exc
                time.sleep(0.5 * (attempt + 1))
        log.error("planned broker restart: its marker cannot be deleted (%s)", error)
        self.report(
            f"metricbus up: the restarted broker's marker topic {self.settings.topics.restarting} "
            f"cannot be deleted ({error}): live training jobs hold their records until it is gone "
            "(or the broker restarts). Delete it with any Kafka admin tool."
        )

    def _restart_broker(self, broker: EmbeddedBroker, now: float) -> None:
        """Start the embedded broker again (it kept nothing: memory-only) and its topics.

        Producers notice the re-created topics and send their last minute of acknowledged
        records again; consumers start over from the new topics and drop the duplicates.
        """
        assert broker.proc is not None
        code = broker.proc.returncode
        self.broker_restarts += 1
        count_restart("broker")
        last = _proc.tail(broker.log_path, proc=broker.proc) if broker.log_path is not None else ""
        self.report(
            f"metricbus up: the embedded broker exited with code {code} (restart "
            f"{self.broker_restarts}); it is memory-only: topics and offsets start over, producers "
            f"send their last minute again. The end of {broker.log_path}:\n{last}"
        )
        log.error("the embedded broker exited with code %s; restarting it", code)
        try:
            broker.start()
            ensure_topics(self.settings)
        except MetricbusError as exc:
            self._broker_next_start = now + min(2**self.broker_restarts, 30)
            self.report(f"metricbus up: the embedded broker cannot start again ({exc}); retrying")

    def run_until(self, stop: threading.Event) -> None:
        """Supervise until ``stop`` is set (raises MetricbusError if a child cannot start)."""
        while not stop.wait(0.5):
            self.supervise_once()

    def wait_started(self, stop: threading.Event | None = None) -> None:
        """Supervise until every child has outlived its start-up (or failed to start: raises)."""
        while not all(c.ever_ran for c in self.children):
            if stop is not None and stop.is_set():
                return
            self.supervise_once()
            time.sleep(0.2)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop consumers (they flush and commit), then the broker. Idempotent."""
        self._stopped.set()
        for child in self.children:
            if child.proc is not None and child.proc.poll() is None:
                child.proc.terminate()
        deadline = time.monotonic() + timeout
        for child in self.children:
            if child.proc is not None:
                _proc.stop(child.proc, max(0.1, deadline - time.monotonic()))
        if self.broker is not None:
            self.broker.stop()

    def describe(self) -> str:
        """Where everything is, for a person."""
        lines = [
            f"kafka        {self.settings.bootstrap_servers}"
            + (" (embedded, memory-only)" if self.broker else "")
        ]
        t = self.settings.topics
        lines.append(f"topics       {t.events}  {t.aggregates}  {t.alerts}  {t.deadletter}")
        lines.append(f"archive      {self.settings.archive_dir}")
        lines.append(f"spool        {self.settings.spool_dir}")
        for child in self.children:
            pid = child.proc.pid if child.proc else "-"
            lines.append(f"{child.name:<12} pid {pid}, log {child.log_path}")
        url = self.dashboard_url
        if url:
            lines.append(f"dashboard    {url}  (also {url}metrics, {url}healthz, {url}readyz)")
        return "\n".join(lines)

    @property
    def dashboard_url(self) -> str | None:
        """The dashboard's address, when the stack runs one."""
        for child in self.children:
            if child.name == "dashboard":
                argv = child.argv
                port = argv[argv.index("--port") + 1] if "--port" in argv else str(DASHBOARD_PORT)
                return f"http://127.0.0.1:{port}/"
        return None

    def __enter__(self) -> Stack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
