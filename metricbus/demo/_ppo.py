"""A small, real PPO (clipped objective, GAE) on CartPole, after cleanrl's ppo.py.

It logs through metricbus the seed metrics it can honestly produce. Needs the ``demo`` extra.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from metricbus.producers import Run


@dataclasses.dataclass(frozen=True)
class PPOConfig:
    """Hyper-parameters; each field is logged as run config."""

    env_id: str = "CartPole-v1"
    num_envs: int = 4
    num_steps: int = 128  #: environment steps per env per update
    updates: int = 30
    learning_rate: float = 2.5e-3
    gamma: float = 0.99
    gae_lambda: float = 0.95
    update_epochs: int = 4
    num_minibatches: int = 4
    clip_coef: float = 0.2
    ent_coef: float = 0.01
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    updates_per_epoch: int = 5  #: the "epoch" seed 004's Epoch/* metrics are computed over
    seed: int = 1


def train(run: Run, cfg: PPOConfig) -> dict[str, float]:
    """Train and log; return a final summary."""
    try:
        import gymnasium as gym
        import numpy as np
        import torch
        from torch import nn
    except ImportError as exc:
        raise SystemExit(
            f"the demo needs torch and gymnasium: pip install 'metricbus[demo]' ({exc})"
        ) from None

    torch.manual_seed(cfg.seed)
    torch.set_num_threads(1)
    envs = gym.vector.SyncVectorEnv([lambda: gym.make(cfg.env_id) for _ in range(cfg.num_envs)])
    obs_dim = int(np.prod(envs.single_observation_space.shape or (1,)))
    n_actions = int(envs.single_action_space.n)  # type: ignore[attr-defined]

    def layer(i: int, o: int, std: float = 2**0.5) -> nn.Linear:
        lin = nn.Linear(i, o)
        nn.init.orthogonal_(lin.weight, std)
        nn.init.constant_(lin.bias, 0.0)
        return lin

    critic = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, 1, 1.0))
    actor = nn.Sequential(layer(obs_dim, 64), nn.Tanh(), layer(64, 64), nn.Tanh(), layer(64, n_actions, 0.01))
    params = list(actor.parameters()) + list(critic.parameters())
    optimizer = torch.optim.Adam(params, lr=cfg.learning_rate, eps=1e-5)

    batch = cfg.num_envs * cfg.num_steps
    minibatch = batch // cfg.num_minibatches
    obs_buf = torch.zeros((cfg.num_steps, cfg.num_envs, obs_dim))
    act_buf = torch.zeros((cfg.num_steps, cfg.num_envs), dtype=torch.long)
    logp_buf = torch.zeros((cfg.num_steps, cfg.num_envs))
    rew_buf = torch.zeros((cfg.num_steps, cfg.num_envs))
    done_buf = torch.zeros((cfg.num_steps, cfg.num_envs))
    val_buf = torch.zeros((cfg.num_steps, cfg.num_envs))

    obs_np, _ = envs.reset(seed=cfg.seed)
    obs = torch.as_tensor(obs_np, dtype=torch.float32)
    done = torch.zeros(cfg.num_envs)
    ep_return = np.zeros(cfg.num_envs)
    ep_len = np.zeros(cfg.num_envs, dtype=np.int64)
    # gymnasium's vector envs reset an ended env on the next step (reward 0, action ignored):
    # that step is no step of any episode
    resetting = np.zeros(cfg.num_envs, dtype=bool)
    all_returns: list[float] = []
    global_step = 0

    for update in range(cfg.updates):
        frac = 1.0 - update / cfg.updates
        lr = frac * cfg.learning_rate
        optimizer.param_groups[0]["lr"] = lr
        finished_returns: list[float] = []
        t0 = time.perf_counter()
        for t in range(cfg.num_steps):
            obs_buf[t], done_buf[t] = obs, done
            with torch.no_grad():
                logits = actor(obs)
                dist = torch.distributions.Categorical(logits=logits, validate_args=False)
                action = dist.sample()
                logp_buf[t], val_buf[t] = dist.log_prob(action), critic(obs).flatten()
            act_buf[t] = action
            obs_np, reward, term, trunc, _ = envs.step(action.numpy())
            ep_return += reward
            ep_len += ~resetting
            ended = np.logical_or(term, trunc)
            resetting = ended
            for i in np.nonzero(ended)[0]:
                finished_returns.append(float(ep_return[i]))
                # an episode that reaches the time limit balanced the pole throughout: a success
                run.log_episode(
                    float(ep_return[i]),
                    length=int(ep_len[i]),
                    success=bool(trunc[i] and not term[i]),
                    reason="pole_fell" if term[i] else "time_limit",
                    step=update,
                    epoch=update // cfg.updates_per_epoch,
                )
                ep_return[i], ep_len[i] = 0.0, 0
            rew_buf[t] = torch.as_tensor(reward, dtype=torch.float32)
            obs = torch.as_tensor(obs_np, dtype=torch.float32)
            done = torch.as_tensor(ended, dtype=torch.float32)
        global_step += batch
        rollout_time = time.perf_counter() - t0

        with torch.no_grad():
            next_value = critic(obs).flatten()
            adv = torch.zeros_like(rew_buf)
            last = torch.zeros(cfg.num_envs)
            for t in reversed(range(cfg.num_steps)):
                nonterminal = 1.0 - (done if t == cfg.num_steps - 1 else done_buf[t + 1])
                nxt = next_value if t == cfg.num_steps - 1 else val_buf[t + 1]
                delta = rew_buf[t] + cfg.gamma * nxt * nonterminal - val_buf[t]
                last = delta + cfg.gamma * cfg.gae_lambda * nonterminal * last
                adv[t] = last
            returns = adv + val_buf

        b_obs, b_act = obs_buf.reshape(batch, obs_dim), act_buf.reshape(batch)
        b_logp, b_adv = logp_buf.reshape(batch), adv.reshape(batch)
        b_ret = returns.reshape(batch)
        t1 = time.perf_counter()
        stats: dict[str, list[float]] = {k: [] for k in ("loss", "pg", "v", "ent", "kl", "clip", "gn")}
        for _ in range(cfg.update_epochs):
            for idx in torch.randperm(batch).split(minibatch):
                dist = torch.distributions.Categorical(logits=actor(b_obs[idx]), validate_args=False)
                logp = dist.log_prob(b_act[idx])
                ratio = (logp - b_logp[idx]).exp()
                mb_adv = (b_adv[idx] - b_adv[idx].mean()) / (b_adv[idx].std() + 1e-8)
                pg_loss = torch.max(
                    -mb_adv * ratio, -mb_adv * ratio.clamp(1 - cfg.clip_coef, 1 + cfg.clip_coef)
                ).mean()
                v_loss = 0.5 * ((critic(b_obs[idx]).flatten() - b_ret[idx]) ** 2).mean()
                entropy = dist.entropy().mean()
                loss = pg_loss - cfg.ent_coef * entropy + cfg.vf_coef * v_loss
                optimizer.zero_grad()
                loss.backward()
                grad_norm = nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
                optimizer.step()
                with torch.no_grad():
                    log_ratio = logp - b_logp[idx]
                    stats["kl"].append(float(((ratio - 1) - log_ratio).mean()))
                    stats["clip"].append(float(((ratio - 1.0).abs() > cfg.clip_coef).float().mean()))
                for key, val in (
                    ("loss", loss),
                    ("pg", pg_loss),
                    ("v", v_loss),
                    ("ent", entropy),
                    ("gn", grad_norm),
                ):
                    stats[key].append(float(val.detach()))
        backprop_time = time.perf_counter() - t1

        mean = {k: float(np.mean(v)) for k, v in stats.items()}
        metrics: dict[str, Any] = {
            "Train/Loss": mean["loss"],
            "Train/PolicyLoss": mean["pg"],
            "Train/ValueLoss": mean["v"],
            "Train/Entropy": mean["ent"],
            "Train/ApproxKL": mean["kl"],
            "Train/ClipFraction": mean["clip"],
            "Train/GradNorm": mean["gn"],
            "Train/LearningRate": lr,
            "Performance/Rollout_StepsPerSec": batch / rollout_time,
            "Performance/Rollout_Time": rollout_time,
            "Performance/Backprop_SamplesPerSec": batch * cfg.update_epochs / backprop_time,
            "Performance/Backprop_Time": backprop_time,
            "global_step": global_step,
            "Train/NumSamples": batch,  # environment steps this update learned from: Epoch/NumSamples
        }
        if finished_returns:
            r = np.asarray(finished_returns)
            metrics.update(
                {
                    "Train/AvgReward": r.mean(),
                    "Train/RewardStd": r.std(),
                    "Train/RewardMin": r.min(),
                    "Train/RewardMax": r.max(),
                    "Train/RewardVariance": r.var(),
                }
            )
            all_returns.extend(finished_returns)
        run.log(metrics, step=update, epoch=update // cfg.updates_per_epoch)
        if update % 5 == 0:
            run.log_histogram("Train/Advantages", b_adv.numpy(), bins=32, step=update)
        final = update == cfg.updates - 1
        if obs_dim == 4 and (update % cfg.updates_per_epoch == 0 or final):  # CartPole: its policy, drawn
            run.log_image("policy/push_right", _policy_map(actor, torch, np), step=update, caption=POLICY_MAP)

    envs.close()
    tail = np.asarray(all_returns[-20:] or [0.0])
    run.log_table(
        "episode_reward_summary",
        ["criterion", "mean", "std", "min", "max", "samples"],
        [["episode/reward (last 20)", tail.mean(), tail.std(), tail.min(), tail.max(), len(tail)]],
    )
    return {"final/episode_reward_mean": float(tail.mean()), "final/episodes": float(len(all_returns))}


POLICY_MAP = "P(push right): pole angle -12..12 degrees left to right, angular velocity -2..2 rad/s down"


def _policy_map(actor: Any, torch: Any, np: Any) -> Any:
    """CartPole's policy over pole angle x angular velocity (cart at rest): blue left, red right."""
    angle, velocity = np.meshgrid(np.linspace(-0.21, 0.21, 64), np.linspace(-2.0, 2.0, 64))
    states = np.stack([np.zeros_like(angle), np.zeros_like(angle), angle, velocity], axis=-1)
    with torch.no_grad():
        logits = actor(torch.as_tensor(states.reshape(-1, 4), dtype=torch.float32))
        right = torch.softmax(logits, dim=-1)[:, 1].numpy().reshape(64, 64)
    return np.stack([right * 255, np.full_like(right, 60), (1 - right) * 255], axis=-1).astype(np.uint8)
