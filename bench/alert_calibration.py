"""The default alert pack's error rates: how often it fires on healthy runs, how soon on defects.

Every number comes from the stream worker's own code with the default rule pack
(``stream_jobs/rules/default.yaml``):

1. Healthy runs, fed to the worker's ``AlertEngine`` as the worker feeds it (the run's reward
   series as ``@reward``, its loss as ``@loss``, in columns of 1,000 values): a plateau and a
   learning curve, each with Gaussian, Student-t (3 and 4 degrees of freedom) and AR(1) noise
   (phi 0.5 and 0.9), at 1k, 10k, 100k and 1M steps. Printed: the share of runs that fired any
   rule, with its 95 % upper bound (Clopper-Pearson), and which rules fired.
2. Whole healthy runs through the worker's ``StreamProcessor`` (every derived series, the epoch
   rules, the system thresholds), rewards in [0, 1] logged as scalars and as sample arrays,
   epochs of 50, 500 and 5,000 steps, and two ranks of one run.
3. Injected defects, each in runs of its own: a reward collapse by 3 and by 10 standard
   deviations of the noise, a loss that turns NaN, diverges (x1.1 a step) or freezes, a run
   that stops logging, a run that stalls below its reward target, a straggler rank, memory
   pressure. Printed: the share found and the delay in steps (or seconds, for silence) from the
   first value that shows the defect to the first firing alert, median / 95th percentile / max.
4. For comparison, the z-score rule the pack used before (a value more than 4 sd below the
   mean of its last 20) on the same healthy noise: what a detector without a measured error
   rate does on long runs.

Environment: BENCH_SCALE multiplies the number of runs (default 1: 300 runs of 100k steps per
noise family and shape), BENCH_JOBS the worker processes (default: the cores), BENCH_PARTS the
parts to run (default 1234).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import sys
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
from scipy.signal import lfilter
from scipy.stats import beta

SCALE = float(os.environ.get("BENCH_SCALE", 1.0))
JOBS = int(os.environ.get("BENCH_JOBS", os.cpu_count() or 1))
PARTS = os.environ.get("BENCH_PARTS", "1234")

NOISES = ("gauss", "t3", "t4", "ar0.5", "ar0.9")
SHAPES = ("plateau", "learning")
#: steps -> healthy runs per (noise, shape) at BENCH_SCALE 1
LENGTHS = {1_000: 1000, 10_000: 300, 100_000: 300, 1_000_000: 10}
COLUMN = 1000  #: values per engine call (the worker gets a record's column at a time)
STEP_MS = 100  #: event time of a step: 10 steps a second


def runs(n: int) -> int:
    return max(1, round(n * SCALE))


# -- noise and curves ----------------------------------------------------------------------


def noise(family: str, rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` values of zero mean and unit standard deviation from one noise family."""
    if family == "gauss":
        return rng.standard_normal(n)
    if family.startswith("t"):
        df = int(family[1:])
        return rng.standard_t(df, n) / math.sqrt(df / (df - 2))
    if family.startswith("ar"):
        phi = float(family[2:])
        e = rng.standard_normal(n) * math.sqrt(1 - phi * phi)
        e[0] = rng.standard_normal()  # start in the stationary distribution
        return np.asarray(lfilter([1.0], [1.0, -phi], e))
    raise ValueError(family)


def curve(shape: str, n: int, start: float, end: float) -> np.ndarray:
    """A plateau at ``end``, or a learning curve from ``start`` to ``end`` (exponential, tau n/5)."""
    if shape == "plateau":
        return np.full(n, end)
    t = np.arange(n)
    return end + (start - end) * np.exp(-5.0 * t / n)


# -- part 1: series rules on the engine ----------------------------------------------------


def engine() -> Any:
    from metricbus.stream_jobs import DEFAULT_RULES, load_rules
    from metricbus.stream_jobs._alerts import AlertEngine

    return AlertEngine(load_rules(DEFAULT_RULES))


#: name -> (role, steps, values): what the worker's engine sees of a run
Series = dict[str, tuple[str | None, np.ndarray, np.ndarray]]


def feed(eng: Any, series: Series, n: int) -> list[dict[str, Any]]:
    """Every series' values in step order, COLUMN steps at a time, as the worker feeds them."""
    out: list[dict[str, Any]] = []
    for lo in range(0, n, COLUMN):
        for name, (role, steps, values) in series.items():
            a, b = np.searchsorted(steps, [lo, lo + COLUMN])
            if a == b:
                continue
            at = steps[a:b].tolist()
            out += eng.observe_many("run", name, values[a:b].tolist(), at, [s * STEP_MS for s in at], role)
    return out


def epochs(reward: np.ndarray, epoch_len: int) -> Series:
    """Epoch/AvgReward and Epoch/RewardVariance as the worker derives them (population variance)."""
    n = len(reward) // epoch_len * epoch_len
    blocks = reward[:n].reshape(-1, epoch_len)
    ends = np.arange(epoch_len - 1, n, epoch_len)
    return {
        "Epoch/AvgReward": (None, ends, blocks.mean(axis=1)),
        "Epoch/RewardVariance": (None, ends, blocks.var(axis=1)),
    }


def healthy(family: str, shape: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A healthy run's reward (in [0, 1]) and loss per step: a plateau or a learning curve."""
    rng = np.random.default_rng(seed)
    reward = np.clip(curve(shape, n, 0.0, 0.9) + 0.05 * noise(family, rng, n), 0, 1)
    loss = curve(shape, n, 2.0, 0.3) + 0.05 * noise(family, rng, n)
    return reward, loss


EPOCH_LENGTHS = (50, 500, 5000)


def part1_cell(args: tuple[str, str, int, int]) -> tuple[str, str, int, int, dict[str, int], list[str]]:
    family, shape, n, count = args
    fired: dict[str, int] = {}
    examples: list[str] = []
    any_fired = 0
    steps = np.arange(n)
    for i in range(count):
        reward, loss = healthy(family, shape, n, seed=zlib.crc32(f"{family}/{shape}/{n}/{i}".encode()))
        epoch_len = EPOCH_LENGTHS[i % len(EPOCH_LENGTHS)]
        series: Series = {
            "Train/AvgReward": ("@reward", steps, reward),
            "Train/Loss": ("@loss", steps, loss),
            **epochs(reward, epoch_len),
        }
        alerts = [a for a in feed(engine(), series, n) if a["state"] == "firing"]
        any_fired += bool(alerts)
        for a in alerts:
            fired[a["rule"]] = fired.get(a["rule"], 0) + 1
            if len(examples) < 3:
                where = f"{family}/{shape}/{n}/epochs of {epoch_len}"
                examples.append(f"{where}: {a['rule']} at step {a['step']}: {a['message']}")
    return family, shape, n, any_fired, fired, examples


def upper95(k: int, n: int) -> float:
    """The one-sided 95 % upper bound of a share k of n (Clopper-Pearson)."""
    return 1.0 if k >= n else float(beta.ppf(0.95, k + 1, n - k))


def part1(pool: ProcessPoolExecutor) -> None:
    print("\n1. Healthy runs on the worker's AlertEngine: reward in [0, 1] and loss (noise sd 0.05), and")
    print("   their epoch series (epochs of 50, 500, 5,000 steps in turn); the share of runs that fired")
    print("   any default rule: fired / runs (95 % upper bound)")
    cells = [(f, s, n, runs(c)) for f in NOISES for s in SHAPES for n, c in LENGTHS.items()]
    results = {(f, s, n): (k, fired, ex) for f, s, n, k, fired, ex in pool.map(part1_cell, cells)}
    counts = {(f, s, n): c for f, s, n, c in cells}
    header = "".join(f"{n:>22,}" for n in LENGTHS)
    print(f"   {'noise':<8}{'shape':<10}{header}")
    rules: dict[str, int] = {}
    examples: list[str] = []
    for f in NOISES:
        for s in SHAPES:
            row = ""
            for n in LENGTHS:
                k, fired, ex = results[(f, s, n)]
                c = counts[(f, s, n)]
                row += f"{f'{k}/{c} ({upper95(k, c):.1%})':>22}"
                for r, m in fired.items():
                    rules[r] = rules.get(r, 0) + m
                examples += ex
            print(f"   {f:<8}{s:<10}{row}")
    print(f"   rules that fired: {rules or 'none'}")
    for line in examples[:10]:
        print(f"     {line}")


# -- runs through the StreamProcessor -------------------------------------------------------


@dataclasses.dataclass
class RunSpec:
    """One synthetic run: its reward and loss per step, and how it is logged."""

    reward: np.ndarray
    loss: np.ndarray
    epoch_len: int
    samples: bool = False  #: the reward as 8 samples a step (their mean is the step's reward)
    system: Callable[[int], dict[str, float]] | None = None  #: the system metrics at a step (every 10)
    silent_from: int | None = None  #: the run logs nothing from this step on (a stall)
    ranks: int = 1
    slow_rank_from: int | None = None  #: rank 1 takes twice as long a step from here
    seed: int = 0


def processor() -> Any:
    from metricbus.stream_jobs import DEFAULT_RULES, StreamProcessor, load_rules

    return StreamProcessor(rules=load_rules(DEFAULT_RULES))


def healthy_system(rng: np.random.Generator) -> Callable[[int], dict[str, float]]:
    def at(step: int) -> dict[str, float]:
        return {
            "System/Memory_Percent": float(np.clip(55 + 5 * rng.standard_normal(), 0, 100)),
            "System/GPU_Utilization": float(np.clip(85 + 5 * rng.standard_normal(), 0, 100)),
            "Performance/Generation_TokensPerSec": float(max(0.0, 40 + 5 * rng.standard_normal())),
        }

    return at


def play(spec: RunSpec, run_id: str = "run") -> tuple[list[dict[str, Any]], int]:
    """The run's events through a StreamProcessor, as its producer would batch them; its alerts.

    Returns the alerts and the last step logged. A silent run is ticked on a clock of its own
    until 600 s of silence have passed; then every run finishes.
    """
    from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Event, run_started

    p = processor()
    n = len(spec.reward)
    rng = np.random.default_rng(spec.seed)
    alerts: list[dict[str, Any]] = []
    seqs = [0] * spec.ranks
    clocks = [0.0] * spec.ranks  #: each rank's event time now (ms)
    end = n if spec.silent_from is None else spec.silent_from
    for r in range(spec.ranks):
        body = run_started("calibration", run_id, world_size=spec.ranks, rank=r)
        alerts += p.process([Event(run_id, f"rank{r}", 0, 0, RUN_STARTED, body, b"")]).alerts
    batch: list[list[Any]] = [[] for _ in range(spec.ranks)]
    for step in range(end):
        for r in range(spec.ranks):
            scalars: dict[str, float] = {"Train/Loss": float(spec.loss[step])}
            samples: dict[str, list[float]] = {}
            if spec.samples:
                spread = 0.05 * rng.standard_normal(8)
                samples["Train/Reward"] = np.clip(spec.reward[step] + spread - spread.mean(), 0, 1).tolist()
            else:
                scalars["Train/AvgReward"] = float(spec.reward[step])
            if spec.system is not None and step % 10 == 0 and r == 0:
                scalars.update(spec.system(step))
            # ranks keep in step (each step ends in a collective), each a few ms late at random;
            # a straggler takes twice as long a step from its slow_rank_from
            behind = 0 if spec.slow_rank_from is None or r != 1 else max(0, step - spec.slow_rank_from)
            clocks[r] = (step + behind) * STEP_MS + rng.uniform(0, 30)
            seqs[r] += 1
            body = {
                "step": step,
                "epoch": step // spec.epoch_len,
                "rank": r,
                "scalars": scalars,
                "samples": samples,
            }
            batch[r].append(Event(run_id, f"rank{r}", seqs[r], int(clocks[r]), METRICS, body, b""))
        if (step + 1) % 100 == 0 or step == end - 1:  # a record of 100 steps per rank
            order = sorted(range(spec.ranks), key=lambda r: batch[r][-1].ts_ms if batch[r] else 0)
            for r in order:
                if batch[r]:
                    alerts += p.process(batch[r]).alerts
                    batch[r] = []
    last_ms = int(max(clocks))
    if spec.silent_from is not None:  # the worker's clock goes on: it ticks once a second
        for now in range(last_ms + 1000, last_ms + 600_000, 1000):
            for a in p.tick(now).alerts:
                a["silent_s"] = (now - last_ms) / 1000
                alerts.append(a)
    for r in range(spec.ranks):
        seqs[r] += 1
        finished = Event(
            run_id, f"rank{r}", seqs[r], last_ms + 1, RUN_FINISHED, {"status": "finished", "summary": {}}, b""
        )
        alerts += p.process([finished]).alerts
    return alerts, end - 1


def whole_healthy(args: tuple[str, str, int, int, int]) -> tuple[str, set[str]]:
    """One healthy run through the processor; ``family`` "ranks": two ranks, Gaussian noise."""
    family, shape, n, epoch_len, seed = args
    reward, loss = healthy("gauss" if family == "ranks" else family, shape, n, seed)
    rng = np.random.default_rng(seed)
    spec = RunSpec(reward, loss, epoch_len, samples=seed % 2 == 1, system=healthy_system(rng), seed=seed)
    if family == "ranks":
        spec.ranks, spec.samples = 2, False
    alerts, _ = play(spec)
    key = f"{'2 ranks' if family == 'ranks' else family}/{shape}"
    return key, {a["rule"] for a in alerts if a["state"] == "firing"}


def part2(pool: ProcessPoolExecutor) -> None:
    print("\n2. Whole healthy runs through the worker's StreamProcessor (rewards in [0, 1], noise sd 0.05;")
    print("   every other run logs its reward as 8 samples a step; epochs of 50, 500, 5,000 steps cycle)")
    for n, count in ((10_000, 20), (100_000, 3)):
        cells = [
            (f, s, n, (50, 500, 5000)[i % 3], 1009 * i + n)
            for f in (*NOISES, "ranks")
            for s in SHAPES
            for i in range(runs(count))
        ]
        tally: dict[str, list[int]] = {}
        fired: dict[str, int] = {}
        for key, rules in pool.map(whole_healthy, cells):
            t = tally.setdefault(key, [0, 0])
            t[0] += bool(rules)
            t[1] += 1
            for r in rules:
                fired[r] = fired.get(r, 0) + 1
        print(f"   {n:,} steps:")
        for key, (k, c) in tally.items():
            print(f"     {key:<20} {k}/{c} fired ({upper95(k, c):.1%} upper bound)")
        print(f"     rules that fired: {fired or 'none'}")


# -- part 3: defects ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Defect:
    """An injected defect: the rule that must find it and how the run is made."""

    name: str
    rule: str
    make: Callable[[np.random.Generator, str, int], RunSpec]
    unit: str = "steps"


N_DEFECT = 12_000  #: steps of a defect run
ONSET = 6_000  #: the defect starts at a step in [ONSET, ONSET + 20): anywhere in a block


def _base(rng: np.random.Generator, family: str, n: int = N_DEFECT) -> tuple[np.ndarray, np.ndarray]:
    reward = np.clip(0.5 + 0.05 * noise(family, rng, n), 0, 1)  # in [0, 1]: the target rules apply
    loss = 1.0 + 0.05 * noise(family, rng, n)
    return reward, loss


def collapse(size: float) -> Callable[[np.random.Generator, str, int], RunSpec]:
    def make(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
        reward, loss = _base(rng, family)
        reward[onset:] -= size * 0.05
        return RunSpec(reward, loss, 500)

    return make


def loss_nan(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
    reward, loss = _base(rng, family)
    loss[onset] = math.nan
    return RunSpec(reward, loss, 500)


def loss_diverges(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
    reward, loss = _base(rng, family)
    loss[onset:] = loss[onset:] * 1.1 ** np.arange(1, N_DEFECT - onset + 1).clip(max=300)
    return RunSpec(reward, loss, 500)


def loss_frozen(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
    reward, loss = _base(rng, family)
    loss[onset:] = loss[onset]
    return RunSpec(reward, loss, 500)


def falls_silent(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
    reward, loss = _base(rng, family, onset + 100)
    return RunSpec(reward, loss, 500, silent_from=onset)


def stalls_below_target(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
    """Learns from 0.1 to 0.5 until the onset, then stalls there, below the 0.7 target."""
    n = 4 * N_DEFECT  # the rule compares two spans of 10,000 steps: it needs the room
    level = np.minimum(0.1 + 0.4 * np.arange(n) / onset, 0.5)
    reward = np.clip(level + 0.05 * noise(family, rng, n), 0, 1)
    loss = 1.0 + 0.05 * noise(family, rng, n)
    return RunSpec(reward, loss, 500)


def noisier(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
    """The reward's noise triples (sd 0.05 -> 0.15: an epoch's variance about 0.02, target < 0.01)."""
    reward, loss = _base(rng, family)
    reward[onset:] = np.clip(0.5 + 3 * (reward[onset:] - 0.5), 0, 1)
    return RunSpec(reward, loss, 500)


def straggler(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
    reward, loss = _base(rng, family, onset + 2000)
    return RunSpec(reward, loss, 500, ranks=2, slow_rank_from=onset)


def memory_pressure(rng: np.random.Generator, family: str, onset: int) -> RunSpec:
    reward, loss = _base(rng, family)
    healthy = healthy_system(rng)

    def at(step: int) -> dict[str, float]:
        values = healthy(step)
        if step >= onset:
            values["System/Memory_Percent"] = 95.0
        return values

    return RunSpec(reward, loss, 500, system=at)


DEFECTS = (
    Defect("reward collapse by 3 sd", "reward_collapse", collapse(3)),
    Defect("reward collapse by 3 sd", "reward_decline", collapse(3)),
    Defect("reward collapse by 10 sd", "reward_collapse", collapse(10)),
    Defect("loss turns NaN", "nan_loss", loss_nan),
    Defect("loss diverges (x1.1 a step)", "loss_diverging", loss_diverges),
    Defect("loss freezes", "loss_frozen", loss_frozen),
    Defect("run falls silent", "run_stalled", falls_silent, "s"),
    Defect("stalls below its 0.7 target", "epoch_reward_below_target", stalls_below_target, "epochs"),
    Defect("reward noise triples", "epoch_reward_unstable", noisier, "epochs"),
    Defect("a rank falls behind", "straggler_rank", straggler),
    Defect("memory above 90 % (every 10 steps)", "memory_pressure", memory_pressure),
)


def defect_run(args: tuple[int, str, int]) -> tuple[int, str, float | None, bool]:
    """(defect, noise, delay or None when not found, fired before the defect)."""
    index, family, seed = args
    d = DEFECTS[index]
    rng = np.random.default_rng(seed)
    onset = ONSET + int(rng.integers(0, 20))
    spec = d.make(rng, family, onset)
    spec.seed = seed
    alerts, _ = play(spec)
    firing = [a for a in alerts if a["rule"] == d.rule and a["state"] == "firing"]
    if not firing:
        return index, family, None, False
    first = firing[0]
    if d.unit == "s":
        return index, family, float(first["silent_s"]), False
    step = first["step"]
    early = step is not None and step < onset
    if d.unit == "epochs":
        return index, family, float(step // spec.epoch_len - onset // spec.epoch_len), early
    return index, family, float(step - onset), early


def part3(pool: ProcessPoolExecutor) -> None:
    print("\n3. Injected defects (runs of 12,000 steps, the defect from a step in 6,000-6,019; noise sd 0.05")
    print("   on a reward of 0.5 and a loss of 1.0): found / runs, delay median / 95th pct / max")
    count = runs(40)
    cells = [
        (i, f, 7919 * i + 31 * j + k)
        for i in range(len(DEFECTS))
        for j, f in enumerate(NOISES)
        for k in range(count)
    ]
    found: dict[tuple[int, str], list[float]] = {}
    early: dict[int, int] = {}
    missed: dict[tuple[int, str], int] = {}
    for index, family, delay, was_early in pool.map(defect_run, cells):
        if delay is None:
            missed[(index, family)] = missed.get((index, family), 0) + 1
        else:
            found.setdefault((index, family), []).append(delay)
        early[index] = early.get(index, 0) + was_early
    print(f"   {'defect':<36}{'rule':<28}" + "".join(f"{f:>22}" for f in NOISES))
    for i, d in enumerate(DEFECTS):
        row = ""
        for f in NOISES:
            delays = sorted(found.get((i, f), []))
            k = len(delays)
            if not delays:
                row += f"{f'0/{count}':>22}"
                continue
            p95 = delays[min(k - 1, math.ceil(0.95 * k) - 1)]
            row += f"{f'{k}/{count} {statistics.median(delays):.0f}/{p95:.0f}/{delays[-1]:.0f}':>22}"
        note = f"  ({early[i]} fired before the defect)" if early.get(i) else ""
        print(f"   {d.name:<36}{d.rule:<28}{row}  {d.unit}{note}")


# -- part 4: the z-score rule, for comparison ----------------------------------------------


def zscore_cell(args: tuple[str, int, int]) -> tuple[str, int, int, int]:
    from metricbus.stream_jobs._alerts import AlertEngine
    from metricbus.stream_jobs._rules import parse_rules

    family, n, count = args
    rules = parse_rules(
        "rules: [{name: z, kind: zscore, metric: '@reward', window: 20, z: 4.0, direction: below}]"
    )
    fired = 0
    for i in range(count):
        rng = np.random.default_rng(zlib.crc32(f"{family}/{n}/{i}".encode()))
        alerts = feed(AlertEngine(rules), {"r": ("@reward", np.arange(n), noise(family, rng, n))}, n)
        fired += any(a["state"] == "firing" for a in alerts)
    return family, n, fired, count


def part4(pool: ProcessPoolExecutor) -> None:
    print("\n4. For comparison: a z-score rule (value more than 4 sd below the mean of its last 20)")
    lengths = (600, 2_000, 10_000, 100_000)
    cells = [(f, n, runs(200 if n < 100_000 else 40)) for f in NOISES for n in lengths]
    print(f"   {'noise':<8}" + "".join(f"{n:>16,}" for n in lengths))
    results = {(f, n): (k, c) for f, n, k, c in pool.map(zscore_cell, cells)}
    for f in NOISES:
        print(f"   {f:<8}" + "".join(f"{f'{results[(f, n)][0]}/{results[(f, n)][1]}':>16}" for n in lengths))


def main() -> None:
    started = time.perf_counter()
    print(f"alert calibration: BENCH_SCALE={SCALE:g}, {JOBS} processes")
    with ProcessPoolExecutor(JOBS) as pool:
        for part, run in (("1", part1), ("2", part2), ("3", part3), ("4", part4)):
            if part in PARTS:
                t = time.perf_counter()
                run(pool)
                print(f"   ({time.perf_counter() - t:.0f} s)")
    print(f"\n({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    sys.exit(main())
