"""What an integration costs a training job, beside its peers in the same run.

SB3: PPO on CartPole, the same seed and steps, learned with no logging beyond SB3's own stdout
(the baseline), with ``metricbus.sb3.MetricbusCallback`` (to the embedded broker), with SB3's
TensorBoard output (``tensorboard_log=``), and with W&B's documented SB3 setup
(``wandb.init(sync_tensorboard=True)`` + ``tensorboard_log=`` + ``wandb.integration.sb3.
WandbCallback``, offline). Reported: the extra wall time and the extra machine CPU (all threads
and child processes, W&B's service included; not the broker's) per environment step over the
baseline, medians of interleaved repeats.

HF: ``on_log`` of a Trainer callback with a typical logs dict (loss, grad_norm, learning_rate,
epoch), called directly: metricbus's callback vs transformers' own ``WandbCallback`` (offline)
and ``TensorBoardCallback``: µs per call in the caller and machine CPU per call.

    .venv/bin/python bench/integration_overhead.py   (BENCH_REPEATS=3, BENCH_SB3_STEPS=4096)
"""

from __future__ import annotations

import collections
import logging
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import EXCLUDED_PIDS, free_port, table, tree_cpu_s  # noqa: E402

REPEATS = int(os.environ.get("BENCH_REPEATS", 3))
SB3_STEPS = int(os.environ.get("BENCH_SB3_STEPS", 4096))
HF_CALLS = int(os.environ.get("BENCH_HF_CALLS", 2000))


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


def _timed(learn: Any) -> tuple[float, float]:
    """(wall s, CPU s) of ``learn()`` plus whatever it left to finish."""
    cpu0, t0 = tree_cpu_s(), time.perf_counter()
    learn()
    return time.perf_counter() - t0, tree_cpu_s() - cpu0


def sb3_baseline(tmp: str) -> tuple[float, float]:
    model = _ppo()
    return _timed(lambda: model.learn(SB3_STEPS))


def sb3_metricbus(tmp: str, bootstrap: str) -> tuple[float, float]:
    from metricbus.sb3 import MetricbusCallback
    from schemas import Settings

    settings = Settings(bootstrap=bootstrap, data_dir=Path(tmp) / "mb")
    model = _ppo()

    def learn() -> None:
        callback = MetricbusCallback(project="bench", settings=settings, system_metrics=False)
        model.learn(SB3_STEPS, callback=callback)  # the callback finishes (flushes) the run at the end

    return _timed(learn)


def sb3_tensorboard(tmp: str) -> tuple[float, float]:
    model = _ppo(tensorboard_log=f"{tmp}/tb")
    return _timed(lambda: model.learn(SB3_STEPS))


def sb3_wandb(tmp: str) -> tuple[float, float]:
    import wandb
    from wandb.integration.sb3 import WandbCallback

    model = _ppo(tensorboard_log=f"{tmp}/wbtb")

    def learn() -> None:
        run = wandb.init(
            project="bench",
            dir=tmp,
            mode="offline",
            sync_tensorboard=True,
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        model.learn(SB3_STEPS, callback=WandbCallback(verbose=0))
        run.finish()

    return _timed(learn)


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
    from schemas import Settings

    cb = MetricbusCallback(
        project="bench", settings=Settings(bootstrap=bootstrap, data_dir=Path(tmp) / "mb"), system_metrics=False
    )
    return _on_log_cost(cb, tmp, cb.on_train_begin, cb.on_train_end)


def hf_wandb(tmp: str) -> tuple[float, float]:
    import wandb
    from transformers.integrations import WandbCallback

    os.environ["WANDB_MODE"] = "offline"
    os.environ["WANDB_SILENT"] = "true"
    os.environ["WANDB_DIR"] = tmp
    cb = WandbCallback()

    def end(args: Any, state: Any, control: Any) -> None:
        wandb.finish()

    return _on_log_cost(cb, tmp, lambda a, s, c: cb.setup(a, s, None), end)


def hf_tensorboard(tmp: str) -> tuple[float, float]:
    from transformers.integrations import TensorBoardCallback

    cb = TensorBoardCallback()
    return _on_log_cost(cb, tmp, cb.on_train_begin, cb.on_train_end)


def main() -> None:
    from metricbus._broker import EmbeddedBroker

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    sb3: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    hf: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    with (
        tempfile.TemporaryDirectory() as tmp,
        EmbeddedBroker(free_port(), log_path=Path(tmp) / "broker.log") as broker,
    ):
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
        """Median over repeats of the cost above the baseline of the same repeat, µs per env step."""
        return statistics.median(
            (v[k] - b[k]) / SB3_STEPS * 1e6 for v, b in zip(sb3[name], sb3["baseline"], strict=True)
        )

    base_wall = statistics.median(b[0] for b in sb3["baseline"]) / SB3_STEPS * 1e6
    print(f"SB3 PPO CartPole, {SB3_STEPS} steps, median of {REPEATS} interleaved repeats")
    print(f"  baseline (no logging integration): {base_wall:.1f} µs wall per env step")
    ours = extra("metricbus", 1)
    table(
        "extra machine CPU per env step over the baseline (µs; lower is better)",
        [
            ("metricbus.sb3.MetricbusCallback", ours, "to the embedded broker, every episode too"),
            ("SB3 tensorboard_log=", extra("tensorboard", 1), ""),
            ("W&B: sync_tensorboard + WandbCallback", extra("wandb", 1), "offline, service included"),
        ],
        ours,
        "µs/step",
    )
    ours_wall = extra("metricbus", 0)
    table(
        "extra wall time per env step over the baseline (µs; lower is better)",
        [
            ("metricbus.sb3.MetricbusCallback", ours_wall, ""),
            ("SB3 tensorboard_log=", extra("tensorboard", 0), ""),
            ("W&B: sync_tensorboard + WandbCallback", extra("wandb", 0), "incl. wandb.init/finish"),
        ],
        ours_wall,
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
