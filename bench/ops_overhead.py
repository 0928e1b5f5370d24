"""What ops monitoring costs a consumer: the Parquet sink's events/s with and without it.

One topic filled with N events; the Parquet sink (the real SinkRunner, in this process)
consumes all of them, as a fresh consumer group each time, under three conditions, taken in
turn within each repeat (the machine's speed drifts between repeats):

1. bare: the sink's Prometheus counters switched off (their methods replaced by no-ops);
2. + metrics: counters on, in a PROMETHEUS_MULTIPROC_DIR as under `metricbus up`;
3. + dashboard: as 2, with `metricbus dashboard` running against the same topics (it reads
   them all while the sink does, samples every group's lag every 5 s) and one browser-like
   client following the run's live stream.

Prints events/s (median) and each condition's ratio to the bare sink of the same repeat.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import fill, free_port  # noqa: E402

N = int(os.environ.get("BENCH_EVENTS", 100_000))
REPEATS = int(os.environ.get("BENCH_REPEATS", 3))


def consume(settings, out: Path, group: str, metrics_on: bool) -> float:
    from metricbus.schemas import LoopMetrics
    from metricbus.sinks import SinkRunner, make_sink

    saved = {name: getattr(LoopMetrics, name) for name in ("update", "observe", "stamp")}
    if not metrics_on:
        for name in saved:
            setattr(LoopMetrics, name, lambda *a, **k: None)
    try:
        runner = SinkRunner(
            make_sink("parquet", out),
            settings,
            topics=[settings.topics.events],
            flush_interval_s=2.0,
            group_id=group,
        )

        async def main() -> float:
            task = asyncio.create_task(runner.run())
            t0 = time.perf_counter()
            while runner.stats.written < N and not task.done():
                await asyncio.sleep(0.02)
            elapsed = time.perf_counter() - t0
            runner.stop()
            await task
            return N / elapsed

        return asyncio.run(main())
    finally:
        for name, fn in saved.items():
            setattr(LoopMetrics, name, fn)


def follow(url: str, stop: threading.Event) -> None:
    """A browser-like client: reads the run's live stream until told to stop."""
    try:
        with urllib.request.urlopen(url, timeout=30) as stream:  # noqa: S310 - our own server
            while not stop.is_set() and stream.readline():
                pass
    except OSError:
        pass


def main() -> None:
    from metricbus.schemas import Settings, ensure_topics
    from metricbus.stack._broker import EmbeddedBroker

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    bare, metrics, dashboard = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(Path(tmp) / "prom")
        Path(tmp, "prom").mkdir()
        with EmbeddedBroker(free_port(), log_path=Path(tmp) / "broker.log") as broker:
            settings = Settings(bootstrap=broker.bootstrap, data_dir=Path(tmp) / "d", partitions=1)
            ensure_topics(settings)
            fill(settings, N)
            from metricbus.ops._board import RunBoard

            run_id = RunBoard(settings).read_once().runs_table()[0]["run_id"]
            for r in range(REPEATS):
                bare.append(consume(settings, Path(tmp) / f"a{r}", f"bench.a{r}", metrics_on=False))
                metrics.append(consume(settings, Path(tmp) / f"b{r}", f"bench.b{r}", metrics_on=True))
                port = free_port()
                env = {**os.environ, **settings.to_env()}
                proc = subprocess.Popen(
                    [sys.executable, "-m", "metricbus", "dashboard", "--port", str(port)],
                    env=env,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                stop = threading.Event()
                try:
                    deadline = time.monotonic() + 30
                    while time.monotonic() < deadline:
                        try:
                            urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=1)  # noqa: S310
                            break
                        except OSError:
                            time.sleep(0.2)
                    client = threading.Thread(
                        target=follow,
                        args=(f"http://127.0.0.1:{port}/api/runs/{run_id}/stream", stop),
                        daemon=True,
                    )
                    client.start()
                    dashboard.append(consume(settings, Path(tmp) / f"c{r}", f"bench.c{r}", metrics_on=True))
                finally:
                    stop.set()
                    proc.terminate()
                    proc.wait(20)
    b = statistics.median(bare)
    print(f"{N:,} events (3 scalars each) through the Parquet sink, {REPEATS} repeats; events/s (median)")
    print(f"  {'':<52}{'events/s':>12}   ratio to bare: median [min-max]")
    print(f"  {'sink, Prometheus counters off (bare)':<52}{b:>12,.0f}   1.00x")
    for label, values in (
        ("sink + Prometheus counters (multiprocess)", metrics),
        ("sink + counters + dashboard running, one live client", dashboard),
    ):
        ratios = sorted(x / y for x, y in zip(values, bare, strict=True))
        print(
            f"  {label:<52}{statistics.median(values):>12,.0f}   "
            f"{statistics.median(ratios):.2f}x [{ratios[0]:.2f}-{ratios[-1]:.2f}]"
        )


if __name__ == "__main__":
    main()
