"""One training process logging 1M scalars/s (100,000 calls of 10 scalars) for 60 s into the topic.

Paces ``Run.log`` at SUSTAINED_RATE calls/s (default 100,000) for SUSTAINED_S seconds (default
60) against the embedded broker, timing every call, and samples the publisher's queue and
unsent spool once a second. Then waits for everything to be acknowledged, reads the topic back
and counts the run's events: nothing may be missing or doubled.

Prints the rate reached, the caller's p50/p99/p99.9/max, calls over 1 ms, the CPU of this
process and of the broker, CPython's full collections meanwhile (the tail's main cause), the
queue's and the spool's peaks, events shed, the drain time, and beside it the peers' own ceiling measured in
the same run: ``wandb.log`` (offline) and ``SummaryWriter.add_scalar`` x10 in a tight loop for
PEER_S seconds (default 5), as scalars/s.
"""

from __future__ import annotations

import array
import collections
import gc
import os
import sys
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import bench_broker  # noqa: E402

RATE = int(os.environ.get("SUSTAINED_RATE", 100_000))
SECONDS = float(os.environ.get("SUSTAINED_S", 60))
PEER_S = float(os.environ.get("PEER_S", 5))
VALUES = [{f"Train/metric_{j}": 0.001 * i + j for j in range(10)} for i in range(1000)]


def pace(log, seconds: float, rate: int) -> tuple[array.array, float]:  # type: ignore[no-untyped-def, type-arg]
    """Call ``log(values, step)`` ``rate`` times a second for ``seconds``; (ns per call, seconds).

    The timings go to an ``array``, not a list: the collector walks a list of six million ints
    on each full pass (measured: the passes grew to 200 ms), an array not at all.
    """
    lat = array.array("q")
    clock = time.perf_counter_ns
    started = clock()
    end = started + int(seconds * 1e9)
    step = 0
    while True:
        now = clock()
        if now >= end:
            break
        due = (now - started) * rate // 1_000_000_000
        if step >= due:  # ahead of the schedule: wait for the next slice
            time.sleep(0.0005)
            continue
        for _ in range(min(due - step, 1000)):
            t = clock()
            log(VALUES[step % 1000], step=step)
            lat.append(clock() - t)
            step += 1
    return lat, (clock() - started) / 1e9


def count_events(settings, run_id: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(distinct, total) seqs of ``run_id``'s logged events in the events topic."""
    from metricbus.schemas import Codec, decode_events, read_topic

    codec = Codec()
    seqs: list[int] = []
    for record in read_topic(settings, settings.topics.events, idle_s=5.0, timeout_s=600.0):
        seqs.extend(e.seq for e in decode_events(codec, record.value) if e.run_id == run_id)
    return len(set(seqs)), len(seqs)


def bench_metricbus(bootstrap: str, data_dir: Path, broker_pid: int) -> float:
    """The paced run; returns the scalars/s reached."""
    from metricbus.producers import Run
    from metricbus.schemas import Settings

    settings = Settings(bootstrap=bootstrap, data_dir=data_dir)
    run = Run("sustained", settings=settings, system_metrics=False)
    publisher = run._publisher
    peaks = {"queue": 0, "spool": 0}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(1.0):
            peaks["queue"] = max(peaks["queue"], len(publisher.queue))
            peaks["spool"] = max(peaks["spool"], publisher.spool.unsent_bytes)

    threading.Thread(target=sample, daemon=True).start()
    full: list[float] = []  # the cyclic collector's full passes (the tail's main cause), seconds each
    started = [0.0]

    def on_gc(phase: str, info: dict) -> None:  # type: ignore[type-arg]
        if info["generation"] == 2:
            if phase == "start":
                started[0] = time.perf_counter()
            else:
                full.append(time.perf_counter() - started[0])

    gc.callbacks.append(on_gc)
    me, broker = psutil.Process(), psutil.Process(broker_pid)
    cpu0 = (sum(me.cpu_times()[:2]), sum(broker.cpu_times()[:2]))
    lat, elapsed = pace(run.log, SECONDS, RATE)
    cpu = (sum(me.cpu_times()[:2]) - cpu0[0], sum(broker.cpu_times()[:2]) - cpu0[1])
    gc.callbacks.remove(on_gc)
    stop.set()
    drain0 = time.monotonic()
    delivered = run.finish(timeout=300)
    drain = time.monotonic() - drain0
    stats = run.stats()
    calls = len(lat)
    ordered = sorted(lat)

    def q(p: float) -> float:
        return ordered[min(calls - 1, int(p * calls))] / 1000

    print(f"metricbus Run.log, target {RATE:,} calls/s of 10 scalars for {SECONDS:g} s")
    print(f"  reached      {calls / elapsed:,.0f} calls/s = {calls * 10 / elapsed / 1e6:.2f}M scalars/s")
    print(
        f"  caller       p50 {q(0.5):.2f} µs, p99 {q(0.99):.2f}, p99.9 {q(0.999):.1f}, "
        f"max {ordered[-1] / 1e6:.2f} ms; {slow_calls(lat)}"
    )
    print(
        f"  CPU          this process {cpu[0] / elapsed:.2f} cores, the broker {cpu[1] / elapsed:.2f} cores "
        f"(of {psutil.cpu_count()})"
    )
    print(
        f"  collector    {len(full)} full passes of CPython's cyclic GC meanwhile "
        f"({len(full) / elapsed * 60:.0f} a minute), longest "
        f"{max(full, default=0) * 1e3:.1f} ms (every thread waits for one; gc.freeze() after the "
        "model is built shortens them)"
    )
    print(
        f"  backlog      queue peak {peaks['queue']:,} events, unsent spool peak "
        f"{peaks['spool'] / 1e6:.1f} MB; {stats['dropped_events']} events shed"
    )
    print(f"  drain        everything acknowledged {drain:.1f} s after the last call: {delivered}")
    distinct, total = count_events(settings, run.run_id)
    logged = calls + 2  # RunStarted and RunFinished
    print(
        f"  read back    {distinct:,} distinct events of {logged:,} logged ({total - distinct:,} resent "
        f"duplicates): {'OK' if distinct == logged else 'MISSING'}"
    )
    return calls * 10 / elapsed


def slow_calls(lat: array.array) -> str:  # type: ignore[type-arg]
    """Calls over 1 ms, and how long."""
    over = [t for t in lat if t > 1_000_000]
    return (
        f"{len(over)} calls over 1 ms ({sum(t <= 2_000_000 for t in over)} of 1-2 ms, "
        f"{sum(2_000_000 < t <= 5_000_000 for t in over)} of 2-5, {sum(t > 5_000_000 for t in over)} longer)"
    )


def floor(seconds: float) -> None:
    """The floor paced the same way (a deque of the same tuples, drained every 20 ms by a
    thread): its calls over 1 ms and CPython's full collections. What the machine and the
    interpreter give any Python caller at this rate: the tail's cause comes with the rate."""
    queue: collections.deque = collections.deque()
    stop = threading.Event()

    def drain() -> None:
        while not stop.wait(0.02):
            while queue:
                queue.popleft()

    threading.Thread(target=drain, daemon=True).start()
    before = gc.get_stats()[2]["collections"]
    lat, elapsed = pace(
        lambda v, step: queue.append((step, time.time_ns(), "", (step, None, 0, dict(v), None))),
        seconds,
        RATE,
    )
    stop.set()
    passes = gc.get_stats()[2]["collections"] - before
    print(
        f"floor, paced alike for {elapsed:.0f} s: {slow_calls(lat)}; {passes} full collections "
        f"({passes / elapsed * 60:.0f} a minute)"
    )


def peer_rate(name: str, log, seconds: float) -> float:  # type: ignore[no-untyped-def]
    """Scalars/s of ``log`` called as fast as it goes for ``seconds``."""
    calls = 0
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        log(VALUES[calls % 1000], calls)
        calls += 1
    rate = calls * 10 / (time.perf_counter() - started)
    print(f"{name}: {rate:,.0f} scalars/s flat out ({calls:,} calls in {seconds:g} s)")
    return rate


def main() -> None:
    with bench_broker() as (tmp, broker):
        assert broker.proc is not None
        ours = bench_metricbus(broker.bootstrap, Path(tmp) / "mb", broker.proc.pid)
        gc.collect()
        floor(SECONDS)

        import wandb

        os.environ["WANDB_MODE"] = "offline"
        os.environ["WANDB_SILENT"] = "true"
        run = wandb.init(
            project="bench", dir=tmp, settings=wandb.Settings(console="off", x_disable_stats=True)
        )
        wandb_rate = peer_rate("wandb.log (offline)", lambda v, s: run.log(v, step=s), PEER_S)
        run.finish()

        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=f"{tmp}/tb")

        def add(values: dict[str, float], step: int) -> None:
            for name, value in values.items():
                writer.add_scalar(name, value, step)

        tb_rate = peer_rate("SummaryWriter.add_scalar x10", add, PEER_S)
        writer.close()
    print(
        f"\nscalars/s: metricbus {ours / 1e6:.2f}M sustained (paced) vs wandb {wandb_rate / 1e3:.0f}k "
        f"({ours / wandb_rate:.0f}x) and SummaryWriter {tb_rate / 1e3:.0f}k ({ours / tb_rate:.0f}x) flat out"
    )


if __name__ == "__main__":
    main()
