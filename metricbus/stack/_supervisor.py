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

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Collection
from pathlib import Path

from metricbus.schemas import MetricbusError, Settings, count_restart, ensure_topics
from metricbus.stack import _proc
from metricbus.stack._broker import EmbeddedBroker
from metricbus.stack._children import Child, Children
from metricbus.stack._echo import AlertEcho
from metricbus.stack._planned_restart import PlannedRestart

log = logging.getLogger("metricbus.up")
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
        consumers = dict(available_consumers() if consumers is None else consumers)
        self._check_ports(consumers)
        if "dashboard" in consumers and "--port" not in consumers["dashboard"]:
            taken = [settings.local_port] if settings.is_local else []
            port = dashboard_port(None, Path(settings.data_dir), taken)
            consumers["dashboard"] = [*consumers["dashboard"], "--port", str(port)]
        self.children = Children(
            [
                Child(name, [sys.executable, "-m", "metricbus", *args], self.log_dir / f"{name}.log")
                for name, args in consumers.items()
            ],
            env,
            self.report,
        )
        self._stopped = threading.Event()
        self.broker_restarts = 0
        self._broker_next_start = 0.0
        #: restarts of the embedded broker past ``broker_max_mb``, carrying what is unread
        self.planned = (
            PlannedRestart(settings, self.broker, self.children, self.report)
            if self.broker is not None
            else None
        )
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
        self.children.start_all()
        return self

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
                self.children.start(child)
        broker = self.broker
        if (
            broker is not None
            and broker.proc is not None
            and broker.proc.poll() is not None
            and not self._stopped.is_set()
            and now >= self._broker_next_start
        ):
            self._restart_broker(broker, now)
        elif self.planned is not None and not self._stopped.is_set():
            self.planned.watch(now)

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
        self.children.stop_all(total_s=timeout)
        if self.broker is not None:
            self.broker.stop()

    def describe(self) -> str:
        """Where everything is, for a person."""
        lines = [
            f"kafka        {self.settings.bootstrap_servers}"
            + (" (embedded, memory-only)" if self.broker else "")
        ]
        t = self.settings.topics
        lines.append(f"topics       {'  '.join(t.all())}")
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
