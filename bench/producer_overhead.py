"""Cost of logging 10 scalars from a training loop: metricbus vs the trackers users weigh, in
one process, interleaved: wandb.log (offline), TensorBoard's SummaryWriter.add_scalar x10,
trackio.log (its local SQLite store) and MLflow's log_metrics (its SQLite store, synchronous and
with ``synchronous=False``). trackio and MLflow are optional: ``pip install trackio mlflow``;
one not installed is said and left out.

Reports the median microseconds per call in the calling thread (median of per-call
timings, then the median over REPEATS runs) and the machine CPU per event (all threads and
child processes, including work deferred to background threads, up to everything flushed),
measured on a second, untimed pass so that the timing harness does not count.
"""

from __future__ import annotations

import collections
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import EXCLUDED_PIDS, bench_broker, table, tree_cpu_s  # noqa: E402

N = int(os.environ.get("BENCH_N", 20_000))
#: calls for MLflow's log_metrics, synchronous or not: a database transaction each (~13-25 ms of
#: CPU an event here, deferred to its thread when asynchronous): N of them would take minutes a
#: pass; its cost per call is flat, so fewer calls measure it
N_SLOW = int(os.environ.get("BENCH_N_SLOW", 1_000))
REPEATS = int(os.environ.get("BENCH_REPEATS", 5))
METRICS = [{f"Train/metric_{j}": 0.001 * i + j for j in range(10)} for i in range(N)]


def measure(make, n: int = N) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(median µs per call in the caller, machine CPU µs per event including deferred work).

    ``make()`` returns ``(log, close)``: a fresh contender. Two passes over the N calls, each
    with its own contender: one timing every call, one untimed whose CPU (all threads and
    child processes, from the first call to the end of ``close``) is counted, so the timing
    harness itself (two clock reads and a list append per call, the median) is not.
    """
    log, close = make()
    lat = []
    for i in range(n):
        t = time.perf_counter_ns()
        log(i)
        lat.append(time.perf_counter_ns() - t)
    close()
    log, close = make()
    cpu0 = tree_cpu_s()
    for i in range(n):
        log(i)
    close()
    cpu = tree_cpu_s() - cpu0
    return statistics.median(lat) / 1000, cpu / n * 1e6


def bench_metricbus(bootstrap: str, data_dir: str) -> tuple[float, float]:
    from metricbus.producers import Run
    from metricbus.schemas import Settings

    def make():  # type: ignore[no-untyped-def]
        run = Run(
            "bench", settings=Settings(bootstrap=bootstrap, data_dir=Path(data_dir)), system_metrics=False
        )

        def close() -> None:
            assert run.finish(timeout=60), "benchmark run did not deliver everything"

        return (lambda i: run.log(METRICS[i], step=i)), close

    return measure(make)


def bench_floor() -> tuple[float, float]:
    def make():  # type: ignore[no-untyped-def]
        q: collections.deque = collections.deque()
        return (lambda i: q.append((i, time.time_ns(), dict(METRICS[i])))), q.clear

    return measure(make)


def bench_wandb(data_dir: str) -> tuple[float, float]:
    import wandb

    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"

    def make():  # type: ignore[no-untyped-def]
        run = wandb.init(
            project="bench", dir=data_dir, settings=wandb.Settings(console="off", x_disable_stats=True)
        )
        return (lambda i: run.log(METRICS[i], step=i)), run.finish

    return measure(make)


def bench_tensorboard(data_dir: str) -> tuple[float, float]:
    from torch.utils.tensorboard import SummaryWriter

    def make():  # type: ignore[no-untyped-def]
        writer = SummaryWriter(log_dir=data_dir)

        def log(i: int) -> None:
            for name, value in METRICS[i].items():
                writer.add_scalar(name, value, i)

        return log, writer.close

    return measure(make)


def bench_trackio(data_dir: str) -> tuple[float, float]:
    os.environ["TRACKIO_DIR"] = data_dir  # its SQLite files here, not in the home directory
    import trackio

    def make():  # type: ignore[no-untyped-def]
        trackio.init(project="bench", name=f"r{time.monotonic_ns()}")
        return (lambda i: trackio.log(METRICS[i], step=i)), trackio.finish

    return measure(make)


def bench_mlflow(data_dir: str, synchronous: bool) -> tuple[float, float]:
    import mlflow

    mlflow.set_tracking_uri(f"sqlite:///{data_dir}/mlflow.db")

    def make():  # type: ignore[no-untyped-def]
        mlflow.start_run()

        def log(i: int) -> None:
            mlflow.log_metrics(METRICS[i], step=i, synchronous=synchronous)

        def close() -> None:
            if not synchronous:
                mlflow.flush_async_logging()
            mlflow.end_run()

        return log, close

    return measure(make, min(N, N_SLOW))


def peers() -> dict[str, Any]:
    """The optional peers that are installed: name -> a function of a directory."""
    import importlib.util

    out: dict[str, Any] = {}
    if importlib.util.find_spec("trackio") is not None:
        out["trackio"] = bench_trackio
    else:
        print("trackio is not installed (pip install trackio): left out")
    if importlib.util.find_spec("mlflow") is not None:
        out["mlflow"] = lambda d: bench_mlflow(d, True)
        out["mlflow async"] = lambda d: bench_mlflow(d, False)
    else:
        print("mlflow is not installed (pip install mlflow): left out")
    return out


def main() -> None:
    results: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    others = peers()
    with bench_broker() as (tmp, broker):
        EXCLUDED_PIDS.add(broker.proc.pid)  # the broker's CPU is Kafka's, not the producer's
        for r in range(REPEATS):  # interleaved, so machine noise hits every contender alike
            results["metricbus"].append(bench_metricbus(broker.bootstrap, f"{tmp}/mb{r}"))
            results["floor"].append(bench_floor())
            results["wandb"].append(bench_wandb(f"{tmp}/wb{r}"))
            results["tensorboard"].append(bench_tensorboard(f"{tmp}/tb{r}"))
            for name, run in others.items():
                where = f"{tmp}/{name.replace(' ', '-')}{r}"
                os.makedirs(where, exist_ok=True)
                results[name].append(run(where))

    def med(name: str, k: int) -> float:
        return statistics.median(v[k] for v in results[name])

    def spread(name: str, k: int) -> str:
        values = [v[k] for v in results[name]]
        return f"{min(values):.3g}-{max(values):.3g}"

    labels = {
        "trackio": "trackio.log",
        "mlflow": f"mlflow.log_metrics ({min(N, N_SLOW)} calls)",
        "mlflow async": f"mlflow.log_metrics(synchronous=False) ({min(N, N_SLOW)} calls)",
    }

    print(
        f"log 10 scalars per call, {N} calls, median of {REPEATS} interleaved runs "
        f"(per-run values: {[round(v[0], 2) for v in results['metricbus']]} µs per call, "
        f"{[round(v[1], 1) for v in results['metricbus']]} µs of CPU per event)"
    )
    ours = med("metricbus", 0)
    # the floor of the same run beside each of ours: the machine's speed drifts between runs
    to_floor = [m[0] / f[0] for m, f in zip(results["metricbus"], results["floor"], strict=True)]
    ratio = statistics.median(to_floor)
    print(f"Run.log / floor, per run: {[round(r, 2) for r in to_floor]} (median {ratio:.2f}x)")
    table(
        "caller-side latency (median µs per call; lower is better)",
        [
            ("metricbus Run.log", ours, f"{ratio:.2f}x the floor; target <= 2x"),
            ("floor: deque.append(copy of dict)", med("floor", 0), "nothing encoded or sent"),
            ("wandb.log (offline)", med("wandb", 0), f"range {spread('wandb', 0)}"),
            ("SummaryWriter.add_scalar x10", med("tensorboard", 0), f"range {spread('tensorboard', 0)}"),
            *((labels[n], med(n, 0), f"range {spread(n, 0)}") for n in others),
        ],
        ours,
        "µs/call",
    )
    ours_cpu = med("metricbus", 1)
    table(
        "machine CPU per event, all threads and child processes (µs; lower is better)",
        [
            ("metricbus (encode + Kafka + spool)", ours_cpu, ""),
            ("wandb.log (offline)", med("wandb", 1), "includes the wandb-core service"),
            ("SummaryWriter.add_scalar x10", med("tensorboard", 1), ""),
            *((labels[n], med(n, 1), f"range {spread(n, 1)}") for n in others),
        ],
        ours_cpu,
        "µs/event",
    )
    print(
        f"\n(each figure: {N} calls of 10 scalars, start and finish included in the CPU: a run's "
        "fixed costs, spread over its events)"
    )


if __name__ == "__main__":
    main()
