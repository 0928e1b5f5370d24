"""The metric names each framework logs for a run's reward, loss and throughput: the alias catalog.

The TensorBoard PPO metric set names its series ``Train/AvgReward`` and ``Train/Loss``; SB3
writes ``rollout/ep_rew_mean`` and ``train/loss``, the Hugging Face Trainer ``loss``, TRL ``reward``, CleanRL
``charts/episodic_return``. One list per role, best first, shared by the stream worker (which
series a run's Epoch/* and rules follow), the TensorBoard sink (its custom-scalars charts) and
the diagnostics (health, report).
"""

from __future__ import annotations

#: The reward: a per-step average logged as a scalar, or per-sample values whose mean is the
#: step's average (both kinds are listed; the deriver prefers samples when a run logs both).
#: For RL frameworks the episode return is the reward.
REWARD_ALIASES: tuple[str, ...] = (
    "Train/AvgReward",  # the TensorBoard PPO metric set, scalar
    "Train/Reward",  # the TensorBoard PPO metric set, samples
    "rollout/episode_return",  # metricbus.sb3: every finished episode's return, samples
    "rollout/ep_rew_mean",  # SB3's logger: mean return of the last 100 episodes
    "reward",  # TRL (GRPO, RLOO, Online DPO): the batch's mean reward
    "train/reward",  # TRL through the wandb naming, Lightning users
    "charts/episodic_return",  # CleanRL: one value per finished episode
    "episode/reward",  # the README's first example (samples)
    "env/reward_mean",  # TRL's PPO trainer
)

#: The loss: the one scalar a run minimises.
LOSS_ALIASES: tuple[str, ...] = (
    "Train/Loss",  # the TensorBoard PPO metric set
    "train/loss",  # SB3 (PPO, A2C, DQN), TRL through wandb naming
    "loss",  # Hugging Face Trainer and TRL's on_log
    "train_loss",  # Lightning's usual self.log("train_loss", ...)
    "train_loss_step",  # Lightning with on_step and on_epoch
    "losses/td_loss",  # CleanRL DQN
    "losses/loss",  # CleanRL variants that log the combined loss
)

#: Throughput: each gets ``<name>_avg`` (run mean) and ``<name>_p99`` beside it, as names that
#: end with the config's ``throughput_suffix`` get ``..._Avg/P99TokensPerSec`` (the TensorBoard
#: PPO metric set's).
THROUGHPUT_ALIASES: tuple[str, ...] = (
    "time/fps",  # SB3
    "charts/SPS",  # CleanRL
    "train_samples_per_second",  # Hugging Face Trainer (at the end of training)
    "train_steps_per_second",
)

#: Counters and schedules: series a rolling mean or an EMA says nothing about (a step count,
#: elapsed time, a learning-rate schedule). Globs; they get no per-metric statistics
#: (``<name>_recent_mean``, ``<name>_ema``, ...) in any sink.
UNSMOOTHED: tuple[str, ...] = (
    "time/iterations",  # SB3
    "time/time_elapsed",
    "time/total_timesteps",
    "train/n_updates",
    "train/learning_rate",
    "train/clip_range",
    "train/clip_range_vf",
    "epoch",  # Hugging Face Trainer
    "learning_rate",
    "train_runtime",
    "total_flos",
    "global_step",
    "trainer/global_step",  # Lightning
    "lr-*",  # Lightning's LearningRateMonitor
    "lr/group*",  # metricbus's run.watch(optimizer=...)
    "charts/learning_rate",  # CleanRL
)
