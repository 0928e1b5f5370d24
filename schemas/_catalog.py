"""The metric names each framework logs for a run's reward, loss and throughput: the alias catalog.

Seed 004 names its series ``Train/AvgReward`` and ``Train/Loss``; SB3 writes ``rollout/ep_rew_mean``
and ``train/loss``, the Hugging Face Trainer ``loss``, TRL ``reward``, CleanRL
``charts/episodic_return``. One list per role, best first, shared by the stream worker (which
series a run's Epoch/* and rules follow), the TensorBoard sink (its custom-scalars charts) and
the diagnostics (health, report).
"""

from __future__ import annotations

#: The reward: a per-step average logged as a scalar, or per-sample values whose mean is the
#: step's average (both kinds are listed; the deriver prefers samples when a run logs both).
#: For RL frameworks the episode return is the reward.
REWARD_ALIASES: tuple[str, ...] = (
    "Train/AvgReward",  # seed 004, scalar
    "Train/Reward",  # seed 004, samples
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
    "Train/Loss",  # seed 004
    "train/loss",  # SB3 (PPO, A2C, DQN), TRL through wandb naming
    "loss",  # Hugging Face Trainer and TRL's on_log
    "train_loss",  # Lightning's usual self.log("train_loss", ...)
    "train_loss_step",  # Lightning with on_step and on_epoch
    "losses/td_loss",  # CleanRL DQN
    "losses/loss",  # CleanRL variants that log the combined loss
)

#: Throughput: each gets ``<name>_avg`` (run mean) and ``<name>_p99`` beside it, as names that
#: end with the config's ``throughput_suffix`` get seed 004's ``..._Avg/P99TokensPerSec``.
THROUGHPUT_ALIASES: tuple[str, ...] = (
    "time/fps",  # SB3
    "charts/SPS",  # CleanRL
    "train_samples_per_second",  # Hugging Face Trainer (at the end of training)
    "train_steps_per_second",
)
