"""Stable-Baselines3 (the ``sb3`` extra): SB3's own logger keys, plus every episode as samples.

    from metricbus.sb3 import MetricbusCallback
    model.learn(100_000, callback=MetricbusCallback(project="cartpole"))

The callback adds a :class:`MetricbusOutputFormat` to the model's logger at training start, so
SB3's stdout / csv / tensorboard outputs stay as they were and every key SB3 writes (``rollout/
ep_rew_mean``, ``train/loss``, ...) arrives at the same ``num_timesteps``. It also publishes each
finished episode's raw return and length from ``Monitor``'s infos (``rollout/episode_return``,
``rollout/episode_length``, and ``rollout/episode_success`` when ``is_success`` is there) as
per-sample arrays at the step the episodes ended, so the stream derives episode statistics
from every episode, not SB3's 100-episode mean. Config: the algorithm's hyperparameters.

Epochs: for on-policy algorithms (PPO, A2C) each rollout is an epoch (rollout k holds timesteps
((k-1)·N, k·N], N = n_steps × n_envs, so a second ``learn()`` keeps counting), and the stream's
Epoch/* series and the default reward rules work on SB3 runs: the episode returns are the run's
reward in the alias catalog, ``train/loss`` its loss. A dump's ``train/*`` keys are those of the
update after the previous rollout, as in SB3's own outputs. Off-policy algorithms (SAC, DQN, ...)
log no epoch.

Media: SB3's ``Video``, ``Figure`` and ``Image`` logger values become metricbus media at the
dump's step, and when the model's env is wrapped in a ``VecVideoRecorder`` each video it records
is published too (``rollout/video``, as an animated GIF every sink shows; the recorder still
writes its MP4 file), so an RL run's episode videos sit beside its curves.
"""

from __future__ import annotations

import numbers
from typing import Any

from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import Figure, Image, KVWriter, Video
from stable_baselines3.common.on_policy_algorithm import OnPolicyAlgorithm
from stable_baselines3.common.vec_env import VecEnvWrapper, VecVideoRecorder

from ._epochs import rollout_epoch
from ._run import Run


class MetricbusOutputFormat(KVWriter):
    """An SB3 logger output: ``logger.output_formats.append(MetricbusOutputFormat(run))``."""

    def __init__(self, run: Run, rollout_size: int | None = None) -> None:
        self.run = run
        self.rollout_size = rollout_size  #: n_steps × n_envs of an on-policy model: epochs by rollout

    def write(self, key_values: dict[str, Any], key_excluded: dict[str, Any], step: int = 0) -> None:
        """Every numeric key SB3 records (not those it excludes for every format)."""
        data = {}
        epoch = rollout_epoch(step, self.rollout_size)
        for key, value in key_values.items():
            excluded = key_excluded.get(key) or ()
            if excluded and "metricbus" in excluded:
                continue
            if isinstance(value, Video):
                self.run.log_video(key, value.frames, fps=value.fps, step=int(step))
            elif isinstance(value, Figure):
                self.run.log_image(key, value.figure, step=int(step))
                if value.close:
                    import matplotlib.pyplot as plt

                    plt.close(value.figure)
            elif isinstance(value, Image):
                self.run.log_image(key, _hwc(value.image, value.dataformats), step=int(step))
            if hasattr(value, "item") and getattr(value, "size", 1) == 1:
                value = value.item()
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                data[key] = float(value)
        if data:
            self.run.log(data, step=int(step), epoch=epoch)

    def close(self) -> None:
        """The run is the callback's (or yours) to finish."""


def _hwc(image: Any, dataformats: str) -> Any:
    """An SB3 Image's array as HxWxC (its ``dataformats``: "HWC", "CHW", "HW")."""
    import numpy as np

    if hasattr(image, "detach"):
        image = image.detach().cpu().numpy()
    arr = np.asarray(image)
    if dataformats.upper() == "CHW" and arr.ndim == 3:
        return arr.transpose(1, 2, 0)
    return arr


def _video_recorder(env: Any) -> VecVideoRecorder | None:
    """The VecVideoRecorder among the wrappers of a model's env, if any."""
    while env is not None:
        if isinstance(env, VecVideoRecorder):
            return env
        env = env.venv if isinstance(env, VecEnvWrapper) else None
    return None


def _hyperparameters(model: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"algo": type(model).__name__}
    for key in (
        "learning_rate",
        "n_steps",
        "batch_size",
        "n_epochs",
        "gamma",
        "gae_lambda",
        "ent_coef",
        "vf_coef",
        "max_grad_norm",
        "buffer_size",
        "learning_starts",
        "tau",
        "train_freq",
        "target_update_interval",
        "seed",
    ):
        value = getattr(model, key, None)
        if value is None:
            continue
        if isinstance(value, numbers.Real | str | bool):
            out[key] = value
        elif callable(value):
            out[key] = "schedule"
        else:
            out[key] = str(value)
    clip = getattr(model, "clip_range", None)
    if clip is not None:
        out["clip_range"] = clip(1.0) if callable(clip) else clip
    env = getattr(model, "env", None)
    if env is not None:
        out["n_envs"] = getattr(env, "num_envs", 1)
    return out


def _run_name(model: Any) -> str | None:
    """``PPO-CartPole-v1``: the algorithm and the environment's id, as SB3 users name runs."""
    algorithm = type(model).__name__
    try:
        specs = model.get_env().get_attr("spec")
        env_id = getattr(specs[0], "id", None) if specs else None
    except Exception:  # noqa: BLE001 - a custom VecEnv without specs: the algorithm alone
        env_id = None
    return f"{algorithm}-{env_id}" if env_id else algorithm


class MetricbusCallback(BaseCallback):
    """Publish an SB3 run to metricbus: its logger's keys and every episode (see the module doc)."""

    def __init__(
        self, project: str = "sb3", name: str | None = None, run: Run | None = None, **init_options: Any
    ):
        super().__init__()
        self._project = project
        self._name = name
        self._options = init_options
        self.run: Run | None = run
        self._own_run = run is None
        self._rollout_size: int | None = None

    def _on_training_start(self) -> None:
        if self.run is None:
            name = self._name or _run_name(self.model)
            self.run = Run(self._project, name=name, config=_hyperparameters(self.model), **self._options)
        if isinstance(self.model, OnPolicyAlgorithm):
            self._rollout_size = self.model.n_steps * self.model.n_envs
        formats = self.model.logger.output_formats
        if not any(isinstance(f, MetricbusOutputFormat) for f in formats):
            formats.append(MetricbusOutputFormat(self.run, self._rollout_size))
        recorder = _video_recorder(self.model.get_env())
        if recorder is not None and not getattr(recorder, "_metricbus", False):
            self._publish_videos(recorder)

    def _publish_videos(self, recorder: VecVideoRecorder) -> None:
        """Publish each video the recorder finishes (its frames, before it writes its MP4)."""
        save = recorder._stop_recording
        recorder._metricbus = True  # type: ignore[attr-defined]

        def stop_recording() -> None:
            frames = recorder.recorded_frames
            if frames and self.run is not None:
                fps = float(recorder.frames_per_sec or 30)  # type: ignore[arg-type]
                caption, step = getattr(recorder, "video_name", None), int(self.num_timesteps)
                self.run.log_video("rollout/video", frames, fps=fps, step=step, caption=caption)
            save()

        recorder._stop_recording = stop_recording  # type: ignore[method-assign]

    def _on_step(self) -> bool:
        returns, lengths, successes = [], [], []
        for info in self.locals.get("infos") or ():
            episode = info.get("episode")
            if episode is not None:
                returns.append(float(episode["r"]))
                lengths.append(float(episode["l"]))
                if "is_success" in info:
                    successes.append(float(bool(info["is_success"])))
        if returns and self.run is not None:
            data: dict[str, Any] = {"rollout/episode_return": returns, "rollout/episode_length": lengths}
            if successes:
                data["rollout/episode_success"] = successes
            step = int(self.num_timesteps)
            self.run.log(data, step=step, epoch=rollout_epoch(step, self._rollout_size))
        return True

    def _on_training_end(self) -> None:
        if self.run is not None and self._own_run:
            self.run.finish()


__all__ = ["MetricbusCallback", "MetricbusOutputFormat"]
