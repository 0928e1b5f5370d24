"""What an integration costs a training job, beside its peers in the same run.

SB3: PPO on CartPole (torch on one thread, so training stays in the main thread), the same
seed and steps, with ``metricbus.sb3.MetricbusCallback`` (to the embedded broker), with SB3's
TensorBoard output (``tensorboard_log=``), and with W&B's documented SB3 setup
(``wandb.init(sync_tensorboard=True)`` + ``tensorboard_log=`` + ``wandb.integration.sb3.
WandbCallback``, offline). PPO's own time varies by more than these costs from run to run, so
the cost is measured where it is spent, not as a difference of training times:

- in the training thread: the wall time inside the integration's code (its callback hooks,
  its logger output format, run start and finish, ``wandb.init``/``finish``), per env step;
- on the machine: that thread's CPU inside those calls, plus the CPU of every other thread and
  child process during training (background encoders, TensorBoard's writer thread, wandb-core;
  not the broker's), per env step. A baseline PPO with no integration measures what those other
  threads cost without one (subtracted).

HF: ``on_log`` of a Trainer callback with a typical logs dict (loss, grad_norm, learning_rate,
epoch), called directly: metricbus's callback vs transformers' own ``WandbCallback`` (offline)
and ``TensorBoardCallback``: µs per call in the caller and machine CPU per call.

    .venv/bin/python bench/integration_overhead.py   (BENCH_REPEATS=3, BENCH_SB3_STEPS=4096)
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import EXCLUDED_PIDS, bench_broker, table, tree_cpu_s  # noqa: E402

REPEATS = int(os.environ.get("BENCH_REPEATS", 3))
SB3_STEPS = int(os.environ.get("BENCH_SB3_STEPS", 4096))
HF_CALLS = int(os.environ.get("BENCH_HF_CALLS", 2000))


class Meter:
    """Wall and CPU time the training thread spends inside the wrapped functions."""

    def __init__(self) -> None:
        self.wall = 0.0
        self.cpu = 0.0

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            w, c = time.perf_counter(), time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.wall += time.perf_counter() - w
                self.cpu += time.thread_time() - c

        return timed

    @contextlib.contextmanager
    def patched(self, owner: Any, *names: str) -> Iterator[None]:
        """Time ``owner.<name>`` for each name while the block runs."""
        saved = {n: owner.__dict__.get(n) for n in names}  # None: inherited
        for n in names:
            setattr(owner, n, self.wrap(getattr(owner, n)))
        try:
            yield
        finally:
            for n, fn in saved.items():
                if fn is None:
                    delattr(owner, n)
                else:
                    setattr(owner, n, fn)


def _ppo(tensorboard_log: str | None = None) -> Any:
    from stable_baselines3 import PPO

    return PPO(
        "MlpPolicy",
        "CartPole-v1",
        n_steps=512,
        batch_size=128,
        n_epochs=2,
        seed=0,
        device="cpu",
        verbose=0,
        tensorboard_log=tensorboard_log,
    )


def _measured(run: Callable[[Meter], None]) -> tuple[float, float]:
    """(wall µs in the integration per env step, machine CPU µs per env step)."""
    meter = Meter()
    cpu0, main0 = tree_cpu_s(), time.thread_time()
    run(meter)
    others = (tree_cpu_s() - cpu0) - (time.thread_time() - main0)  # every thread but this one
    return meter.wall / SB3_STEPS * 1e6, (meter.cpu + others) / SB3_STEPS * 1e6


def sb3_baseline(tmp: str) -> tuple[float, float]:
    model = _ppo()
    return _measured(lambda meter: model.learn(SB3_STEPS))


def sb3_metricbus(tmp: str, bootstrap: str) -> tuple[float, float]:
    from metricbus.producers.sb3 import MetricbusCallback, MetricbusOutputFormat
    from metricbus.schemas import Settings

    settings = Settings(bootstrap=bootstrap, data_dir=Path(tmp) / "mb")
    model = _ppo()

    def run(meter: Meter) -> None:
        hooks = ("_on_training_start", "_on_step", "_on_training_end")
        with meter.patched(MetricbusCallback, *hooks), meter.patched(MetricbusOutputFormat, "write"):
            callback = meter.wrap(MetricbusCallback)(project="bench", settings=settings, system_metrics=False)
            model.learn(SB3_STEPS, callback=callback)  # the callback finishes (flushes) the run

    return _measured(run)


def sb3_tensorboard(tmp: str) -> tuple[float, float]:
    from stable_baselines3.common.logger import TensorBoardOutputFormat

    model = _ppo(tensorboard_log=f"{tmp}/tb")

    def run(meter: Meter) -> None:
        with meter.patched(TensorBoardOutputFormat, "__init__", "write", "close"):
            model.learn(SB3_STEPS)

    return _measured(run)


def sb3_wandb(tmp: str) -> tuple[float, float]:
    import wandb
    from stable_baselines3.common.logger import TensorBoardOutputFormat
    from wandb.integration.sb3 import WandbCallback

    model = _ppo(tensorboard_log=f"{tmp}/wbtb")

    def run(meter: Meter) -> None:
        hooks = ("_init_callback", "_on_training_start", "_on_rollout_start", "_on_step", "_on_rollout_end")
        with (
            meter.patched(WandbCallback, *hooks, "_on_training_end"),
            meter.patched(TensorBoardOutputFormat, "__init__", "write", "close"),
        ):
            wb = meter.wrap(wandb.init)(
                project="bench",
                dir=tmp,
                mode="offline",
                sync_tensorboard=True,
                settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
            )
            model.learn(SB3_STEPS, callback=WandbCallback(verbose=0))
            meter.wrap(wb.finish)()

    return _measured(run)


def _hf_args(tmp: str) -> tuple[Any, Any, Any]:
    from transformers import TrainerControl, TrainerState, TrainingArguments

    args = TrainingArguments(output_dir=tmp, report_to=[], use_cpu=True, logging_dir=f"{tmp}/hf-tb")
    state = TrainerState()
    state.is_world_process_zero = True
    return args, state, TrainerControl()


def _on_log_cost(callback: Any, tmp: str, begin: Any = None, end: Any = None) -> tuple[float, float]:
    """(median µs per on_log in the caller, machine CPU µs per call incl. deferred work)."""
    args, state, control = _hf_args(tmp)
    if begin is not None:
        begin(args, state, control)
    lat = []
    cpu0 = tree_cpu_s()
    for i in range(HF_CALLS):
        state.global_step = i + 1
        logs = {"loss": 2.0 / (i + 1), "grad_norm": 0.5, "learning_rate": 1e-4, "epoch": i / HF_CALLS}
        t = time.perf_counter_ns()
        callback.on_log(args, state, control, logs=logs)
        lat.append(time.perf_counter_ns() - t)
    if end is not None:
        end(args, state, control)
    return statistics.median(lat) / 1000, (tree_cpu_s() - cpu0) / HF_CALLS * 1e6


def hf_metricbus(tmp: str, bootstrap: str) -> tuple[float, float]:
    from metricbus.hf import MetricbusCallback
    from metricbus.schemas import Settings

    cb = MetricbusCallback(
        project="bench",
        settings=Settings(bootstrap=bootstrap, data_dir=Path(tmp) / "mb"),
        system_metrics=False,
    )
    return _on_log_cost(cb, tmp, cb.on_train_begin, cb.on_train_end)


def hf_wandb(tmp: str) -> tuple[float, float]:
    import wandb
    from transformers.integrations import WandbCallback

    cb = WandbCallback()

    def end(args: Any, state: Any, control: Any) -> None:
        wandb.finish()

    return _on_log_cost(cb, tmp, lambda a, s, c: cb.setup(a, s, None), end)


def hf_tensorboard(tmp: str) -> tuple[float, float]:
    from transformers.integrations import TensorBoardCallback

    cb = TensorBoardCallback()
    return _on_log_cost(cb, tmp, cb.on_train_begin, cb.on_train_end)


def main() -> None:
    import torch

    torch.set_num_threads(1)  # training in this thread: other threads' CPU is the integrations'
    os.environ["WANDB_MODE"] = "offline"  # before wandb's first setup reads its settings
    os.environ["WANDB_SILENT"] = "true"
    sb3: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    hf: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    with bench_broker() as (tmp, broker):
        os.environ["WANDB_DIR"] = tmp  # nothing of wandb's in the working directory
        EXCLUDED_PIDS.add(broker.proc.pid)  # the broker's CPU is Kafka's, not the integration's
        for r in range(REPEATS):  # interleaved, so machine noise hits every contender alike
            sb3["baseline"].append(sb3_baseline(f"{tmp}/b{r}"))
            sb3["metricbus"].append(sb3_metricbus(f"{tmp}/m{r}", broker.bootstrap))
            sb3["tensorboard"].append(sb3_tensorboard(f"{tmp}/t{r}"))
            sb3["wandb"].append(sb3_wandb(f"{tmp}/w{r}"))
            hf["metricbus"].append(hf_metricbus(f"{tmp}/hm{r}", broker.bootstrap))
            hf["wandb"].append(hf_wandb(f"{tmp}/hw{r}"))
            hf["tensorboard"].append(hf_tensorboard(f"{tmp}/ht{r}"))

    def extra(name: str, k: int) -> float:
        """Median over repeats, µs per env step; CPU net of the baseline's other threads."""
        if k == 0:
            return statistics.median(v[0] for v in sb3[name])
        return statistics.median(v[1] - b[1] for v, b in zip(sb3[name], sb3["baseline"], strict=True))

    print(f"SB3 PPO CartPole, {SB3_STEPS} steps, median of {REPEATS} interleaved repeats")
    base = statistics.median(b[1] for b in sb3["baseline"])
    print(f"  baseline: other threads {base:.1f} µs CPU per env step with no integration (subtracted)")
    ours = extra("metricbus", 0)
    table(
        "time in the training thread inside the integration, per env step (µs; lower is better)",
        [
            ("metricbus.sb3.MetricbusCallback", ours, "to the embedded broker, every episode too"),
            ("SB3 tensorboard_log=", extra("tensorboard", 0), ""),
            ("W&B: sync_tensorboard + WandbCallback", extra("wandb", 0), "offline, incl. init/finish"),
        ],
        ours,
        "µs/step",
    )
    ours_cpu = extra("metricbus", 1)
    table(
        "machine CPU of the integration per env step, all threads and processes (µs; lower is better)",
        [
            ("metricbus.sb3.MetricbusCallback", ours_cpu, "incl. run start, encoding, sending"),
            ("SB3 tensorboard_log=", extra("tensorboard", 1), ""),
            ("W&B: sync_tensorboard + WandbCallback", extra("wandb", 1), "incl. wandb-core"),
        ],
        ours_cpu,
        "µs/step",
    )

    def med(name: str, k: int) -> float:
        return statistics.median(v[k] for v in hf[name])

    print(f"\nHF Trainer on_log, {HF_CALLS} calls of 4 keys, median of {REPEATS} interleaved repeats")
    ours = med("metricbus", 0)
    table(
        "caller-side latency (median µs per on_log; lower is better)",
        [
            ("metricbus.hf.MetricbusCallback", ours, ""),
            ("transformers WandbCallback", med("wandb", 0), "offline"),
            ("transformers TensorBoardCallback", med("tensorboard", 0), ""),
        ],
        ours,
        "µs/call",
    )
    ours = med("metricbus", 1)
    table(
        "machine CPU per on_log, all threads and child processes (µs; lower is better)",
        [
            ("metricbus.hf.MetricbusCallback", ours, "incl. run start and flush"),
            ("transformers WandbCallback", med("wandb", 1), "incl. wandb-core, init and finish"),
            ("transformers TensorBoardCallback", med("tensorboard", 1), ""),
        ],
        ours,
        "µs/call",
    )


if __name__ == "__main__":
    main()
