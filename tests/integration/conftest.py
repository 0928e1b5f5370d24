"""A real embedded broker (Tansu) for the whole session; every test gets its own topics."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from metricbus.schemas import Settings, aggregate_points, decode_events, default_codec, ensure_topics
from metricbus.schemas import read_topic as _read_topic
from metricbus.stack._broker import EmbeddedBroker

pytestmark = pytest.mark.integration


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def broker(tmp_path_factory):
    b = EmbeddedBroker(free_port(), log_path=tmp_path_factory.mktemp("broker") / "broker.log").start()
    yield b
    b.stop()


@pytest.fixture
def settings(broker, tmp_path) -> Settings:
    s = Settings(
        bootstrap=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:8]}.", data_dir=tmp_path, partitions=2
    )
    ensure_topics(s)
    return s


def read_topic(settings: Settings, topic: str, count: int, timeout: float = 30.0) -> list:
    """Every record of ``topic`` from the beginning, polled until there are ``count`` or timeout."""
    deadline = time.monotonic() + timeout
    records: list = []
    while time.monotonic() < deadline:
        records = _read_topic(settings, topic, timeout_s=max(1.0, deadline - time.monotonic()))
        if len(records) >= count:
            break
        time.sleep(0.2)
    return records


def read_events(settings: Settings, count: int, timeout: float = 30.0) -> list[tuple[str, int, str, dict]]:
    """Decoded events of the events topic: (producer_id, seq, kind, body), in partition order."""
    codec = default_codec()
    events: list = []
    deadline = time.monotonic() + timeout
    while len(events) < count and time.monotonic() < deadline:
        events = []
        for record in read_topic(
            settings, settings.topics.events, 1, timeout=max(0.5, deadline - time.monotonic())
        ):
            events.extend((e.producer_id, e.seq, e.kind, e.body) for e in decode_events(codec, record.value))
        if len(events) < count:
            time.sleep(0.2)
    return events


def spread_run_ids(partitions: int, per_partition: int, prefix: str = "scale") -> list[str]:
    """Run ids the producer's key partitioner spreads ``per_partition`` to each partition, in
    partition order."""
    from kafka.partitioner.default import murmur2

    ids: dict[int, list[str]] = {p: [] for p in range(partitions)}
    n = 0
    while any(len(v) < per_partition for v in ids.values()):
        candidate = f"{prefix}-{uuid.uuid4().hex[:8]}-{n}"
        n += 1
        p = (murmur2(candidate.encode()) & 0x7FFFFFFF) % partitions
        if len(ids[p]) < per_partition:
            ids[p].append(candidate)
    return [r for p in range(partitions) for r in ids[p]]


def log_in_rounds(runs, steps: int, values, after_step=None) -> None:
    """``steps`` steps of every run (``values(i, step)`` for the i-th), published every 10 with
    a second's pause; ``after_step(step)`` after each step; every run finished."""
    for step in range(steps):
        for i, run in enumerate(runs):
            run.log(values(i, step), step=step)
        if step % 10 == 9:
            for run in runs:
                assert run._publisher.flush(10)
            time.sleep(1.0)
        if after_step is not None:
            after_step(step)
    for run in runs:
        assert run.finish(timeout=30)


def cli(settings: Settings, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "metricbus",
        "--bootstrap",
        settings.bootstrap_servers,
        "--topic-prefix",
        settings.topic_prefix,
        "--data-dir",
        str(settings.data_dir),
        *args,
    ]


class SinkProcess:
    """`metricbus sink <kind>` (parquet unless told) as a real child process."""

    def __init__(self, settings: Settings, flush_interval: float = 0.3, kind: str = "parquet") -> None:
        self.settings = settings
        self.flush_interval = flush_interval
        self.kind = kind
        self.log = Path(settings.data_dir) / ("sink.log" if kind == "parquet" else f"sink-{kind}.log")
        self.proc: subprocess.Popen | None = None

    def start(self) -> SinkProcess:
        env = {**os.environ, **self.settings.to_env()}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                cli(self.settings, "sink", self.kind, "--flush-interval", str(self.flush_interval)),
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
            )
        return self

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)
        return self.proc.returncode


@pytest.fixture
def sink(settings):
    procs: list[SinkProcess] = []

    def make(**kw) -> SinkProcess:
        p = SinkProcess(settings, **kw).start()
        procs.append(p)
        return p

    yield make
    for p in procs:
        if p.proc is not None and p.proc.poll() is None:
            p.stop()


@pytest.fixture
def worker(settings, tmp_path):
    log = open(tmp_path / "worker.log", "wb")
    env = {**os.environ, **settings.to_env()}
    proc = subprocess.Popen(cli(settings, "worker"), stdout=log, stderr=subprocess.STDOUT, env=env)
    yield proc
    proc.terminate()
    try:
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def aggregates(settings, count, timeout=60.0):
    codec = default_codec()
    out = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = {}
        for record in read_topic(settings, settings.topics.aggregates, 1, timeout=5):
            _, batch = codec.decode(record.value)
            for p in aggregate_points(batch):
                out.setdefault(p["name"], []).append(p)
        if sum(len(v) for v in out.values()) >= count:
            return out
        time.sleep(0.5)
    return out


def alerts_of_closed_run(settings: Settings, run_id: str, timeout: float = 60.0) -> list[dict]:
    """Every alert the worker raised on a run, read once the worker has closed the run.

    The worker closes a run (an aggregates record that ``closes_run``) in the same output as
    the run's last alerts (``ended`` ones included), which it sends to their topic just after:
    the alerts are read until two reads a second apart agree.
    """
    from metricbus.demo._demo import derived_total

    assert derived_total(settings, run_id, timeout=timeout) is not None, f"the worker never closed {run_id}"
    codec = default_codec()
    previous = -1
    while True:
        got = [
            codec.decode(r.value)[1]
            for r in _read_topic(settings, settings.topics.alerts, timeout_s=5)
            if r.key == run_id.encode()
        ]
        if len(got) == previous:  # counted: an alert's value may be NaN, never equal to itself
            return got
        previous = len(got)
        time.sleep(1.0)


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def get(url: str, timeout: float = 10.0, headers: dict | None = None) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310 - our own server
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture
def dashboard(settings, tmp_path):
    port = free_port()
    log = open(tmp_path / "dashboard.log", "wb")
    env = {**os.environ, **settings.to_env(), "PROMETHEUS_MULTIPROC_DIR": str(tmp_path / "prom")}
    (tmp_path / "prom").mkdir()
    proc = subprocess.Popen(
        cli(settings, "dashboard", "--port", str(port)), stdout=log, stderr=subprocess.STDOUT, env=env
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if get(f"{base}/readyz", 2)[0] == 200:
                break
        except OSError:
            pass
        assert proc.poll() is None, (tmp_path / "dashboard.log").read_text()
        time.sleep(0.3)
    else:
        raise AssertionError("dashboard never ready: " + (tmp_path / "dashboard.log").read_text())
    yield base
    proc.terminate()
    try:
        assert proc.wait(20) == 0, (tmp_path / "dashboard.log").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
        assert "Traceback" not in (tmp_path / "dashboard.log").read_text()
