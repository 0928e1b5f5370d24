"""The dashboard over a large archive: BENCH_RUNS archived runs (default 1,000) of BENCH_METRICS
scalars (20) and BENCH_STEPS steps (2,000) each, none of them on the topics (an earlier stack's
runs, after `metricbus up` restarted).

Measured in the same run, each in a process of its own:
- ours: `metricbus dashboard` over that data dir: its resident memory once it has listed every
  run, and (medians of BENCH_REPEATS) the time the runs page's data (/api/status) and a run
  page's data (/api/runs/<id>, drawn from the archive) take to answer, cold (the run's first
  request) and warm;
- the peer: TensorBoard's own loader (its EventMultiplexer, as `tensorboard --logdir` loads a
  directory of runs, with its default 1,000 points a tag) over the same runs written with
  TensorBoard's own event-file writer: its load time and resident memory, for BENCH_TB_RUNS of
  the runs (default 50; writing 1,000 runs' event files in Python takes longer than the bench)
  and scaled per run.

The archive is built once into BENCH_DIR (default a temporary directory) and kept there when given.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import free_port  # noqa: E402

RUNS = int(os.environ.get("BENCH_RUNS", 1000))
METRICS = int(os.environ.get("BENCH_METRICS", 20))
STEPS = int(os.environ.get("BENCH_STEPS", 2000))
TB_RUNS = int(os.environ.get("BENCH_TB_RUNS", 50))
REPEATS = int(os.environ.get("BENCH_REPEATS", 5))
T0 = 1_700_000_000_000


def run_id(i: int) -> str:
    return f"20261101-000000-{i:08x}"


def build(data_dir: Path) -> None:
    """The archive of RUNS runs, and TB_RUNS of them as TensorBoard's own event files."""
    from metricbus.schemas import METRICS as KIND
    from metricbus.schemas import RUN_FINISHED, RUN_STARTED, Event, default_codec, run_started
    from metricbus.sinks import ParquetArchive

    if (data_dir / "built").exists():
        return
    fp = default_codec().newest("EventBatch").fingerprint
    sink = ParquetArchive(data_dir / "archive")
    sink.open()
    for i in range(RUNS):
        rid = run_id(i)
        config = {"lr": 10 ** -(2 + i % 3), "seed": i % 5}
        events = [Event(rid, "p", 0, T0, RUN_STARTED, run_started("board-bench", f"run-{i}", config), fp)]
        for s in range(STEPS):
            scalars = {f"Train/m{j}": 1.0 / (s + j + 1) for j in range(METRICS)}
            body = {"step": s, "epoch": s // 200, "rank": 0, "samples": {}, "scalars": scalars}
            events.append(Event(rid, "p", s + 1, T0 + s, KIND, body, fp))
        events.append(
            Event(rid, "p", STEPS + 1, T0 + STEPS, RUN_FINISHED, {"status": "finished", "summary": {}}, fp)
        )
        sink.write(events)
        sink.flush()
        if i < TB_RUNS:
            tensorboard_files(data_dir / "tb" / rid, events)
    sink.close()
    (data_dir / "built").write_text("")


def tensorboard_files(directory: Path, events: list) -> None:
    """The run's scalars written with TensorBoard's own event-file writer."""
    from tensorboard.compat.proto import event_pb2, summary_pb2
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    writer = EventFileWriter(str(directory))
    for e in events:
        if e.kind != "metricbus.Metrics":
            continue
        values = [summary_pb2.Summary.Value(tag=k, simple_value=v) for k, v in e.body["scalars"].items()]
        writer.add_event(
            event_pb2.Event(
                wall_time=e.ts_ms / 1000, step=e.body["step"], summary=summary_pb2.Summary(value=values)
            )
        )
    writer.close()


def get(url: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 - our own server
        body = response.read()
    return time.perf_counter() - t, body


def ours(data_dir: Path, runs: int = RUNS) -> dict[str, float]:
    import psutil

    port = free_port()
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(data_dir / "prom")}
    (data_dir / "prom").mkdir(exist_ok=True)
    bootstrap = f"127.0.0.1:{free_port()}"  # no broker: the runs come from the archive alone
    cmd = [sys.executable, "-m", "metricbus", "--bootstrap", bootstrap, "--data-dir", str(data_dir)]
    proc = subprocess.Popen(
        [*cmd, "dashboard", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        started = time.perf_counter()
        while True:
            try:
                _, body = get(f"{base}/api/status")
                if len(json.loads(body)["runs"]) == runs:
                    break
            except OSError:
                pass
            if time.perf_counter() - started > 600:
                raise SystemExit("the dashboard did not list every run in 10 minutes")
            time.sleep(0.5)
        listed = time.perf_counter() - started
        status = [get(f"{base}/api/status")[0] for _ in range(REPEATS)]
        cold, warm = [], []
        for r in range(REPEATS if runs else 0):
            rid = run_id(RUNS - 1 - r * 7)
            took, body = get(f"{base}/api/runs/{rid}")
            assert len(json.loads(body)["series"]) == METRICS
            cold.append(took)
            warm.append(get(f"{base}/api/runs/{rid}")[0])
        rss = psutil.Process(proc.pid).memory_info().rss / 2**20
    finally:
        proc.terminate()
        proc.wait(30)
    return {
        "listed_s": listed,
        "status_s": statistics.median(status),
        "run_cold_s": statistics.median(cold) if cold else math.nan,
        "run_warm_s": statistics.median(warm) if warm else math.nan,
        "rss_mb": rss,
    }


PEER = """
import json, resource, sys, time
from tensorboard.backend.event_processing.plugin_event_multiplexer import EventMultiplexer
t = time.perf_counter()
from tensorboard.backend.event_processing import event_accumulator as ea
m = EventMultiplexer(size_guidance={**ea.DEFAULT_SIZE_GUIDANCE, "scalars": 1000})
m.AddRunsFromDirectory(sys.argv[1])
m.Reload()
took = time.perf_counter() - t
runs = m.Runs()
assert len(runs) == int(sys.argv[2]), len(runs)
print(json.dumps({"load_s": took, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def peer(data_dir: Path) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", PEER, str(data_dir / "tb"), str(TB_RUNS)],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    given = os.environ.get("BENCH_DIR")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(given or tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        t = time.perf_counter()
        build(data_dir)
        print(
            f"archive of {RUNS} runs x {METRICS} metrics x {STEPS} steps "
            f"ready in {time.perf_counter() - t:.0f} s"
        )
        us = ours(data_dir)
        empty = Path(tmp) / "empty"
        empty.mkdir()
        bare = ours(empty, runs=0)  # the same process with no run: what the runs add is the rest
        them = peer(data_dir)
        rows = [
            (
                "resident memory (MB)",
                f"{us['rss_mb']:.0f}",
                f"{them['rss_mb']:.0f}",
                f"~{them['rss_mb'] / TB_RUNS * RUNS:.0f}",
            ),
            (
                "every run listed (s)",
                f"{us['listed_s']:.1f}",
                f"{them['load_s']:.1f}",
                f"~{them['load_s'] / TB_RUNS * RUNS:.0f}",
            ),
            ("runs page data, median (s)", f"{us['status_s']:.3f}", "-", "-"),
            ("a run page's data, first ask (s)", f"{us['run_cold_s']:.3f}", "-", "-"),
            ("a run page's data, again (s)", f"{us['run_warm_s']:.3f}", "-", "-"),
        ]
        print(
            f"  {'':<34}{'metricbus dashboard':>20}"
            f"{f'TensorBoard, {TB_RUNS} runs':>24}{f'per run x {RUNS}':>16}"
        )
        for name, a, b, c in rows:
            print(f"  {name:<34}{a:>20}{b:>24}{c:>16}")
        print(
            f"  the dashboard with no run: {bare['rss_mb']:.0f} MB; each archived run adds "
            f"{(us['rss_mb'] - bare['rss_mb']) / RUNS * 1024:.0f} kB (listed, with the last pages asked "
            f"for); TensorBoard holds {them['rss_mb'] / TB_RUNS * 1024:.0f} kB a run"
        )


if __name__ == "__main__":
    main()
