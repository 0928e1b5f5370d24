"""Real frameworks, tiny and on CPU, through the integrations (issue 10): what the framework's
own logger wrote must be what the archive holds, at the same step."""

from __future__ import annotations

import csv
import math
import time

import pytest

from metricbus.schemas import run_config
from metricbus.sinks import read_events, read_table

from .conftest import aggregates, alerts_of_closed_run

pytestmark = pytest.mark.integration


def archived(settings, run_id: str, ready, timeout: float = 60.0) -> dict:
    """name -> {step: value or samples} of a run's logged events, once ``ready(result)``."""
    deadline = time.monotonic() + timeout
    out: dict = {}
    while time.monotonic() < deadline:
        out = {}
        try:
            table = read_table(
                settings.archive_dir,
                run_id,
                columns=["name", "step", "value", "samples", "producer_id", "kind"],
            )
            for n, s, v, xs, p, k in zip(
                *(table[c].to_pylist() for c in ("name", "step", "value", "samples", "producer_id", "kind"))
            ):
                if p != "metricbus.stream" and k.endswith("Metrics"):
                    out.setdefault(n, {})[s] = xs if xs is not None else v
        except (FileNotFoundError, ValueError, KeyError):
            pass
        if out and ready(out):
            return out
        time.sleep(0.5)
    return out


@pytest.mark.frameworks
def test_lightning_logger_gets_every_metric_the_csv_logger_gets(settings, sink, worker, tmp_path):
    pytest.importorskip("lightning", reason="Lightning is an optional extra; `make test` installs it")
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import CSVLogger

    from metricbus.lightning import MetricbusLogger

    sink(flush_interval=0.3)

    class Tiny(pl.LightningModule):
        def __init__(self, lr: float = 0.05, hidden: int = 4) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(3, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 1)
            )

        def training_step(self, batch, batch_idx):
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.log("train_loss", loss)
            self.log("train_lr", self.hparams.lr)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    torch.manual_seed(0)
    data = torch.utils.data.TensorDataset(torch.randn(32, 3), torch.randn(32, 1))
    ours = MetricbusLogger(project="lightning-test", settings=settings, system_metrics=False)
    theirs = CSVLogger(tmp_path / "csv", name="tiny")
    trainer = pl.Trainer(
        max_epochs=3,
        logger=[ours, theirs],
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accelerator="cpu",
        default_root_dir=tmp_path,
    )
    trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=8))
    run = ours.experiment
    assert run.status == "finished"

    with open(theirs.log_dir + "/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    expected: dict = {}
    for row in rows:
        for key, value in row.items():
            if key not in ("step", "epoch") and value:
                expected.setdefault(key, {})[int(row["step"])] = float(value)
    assert set(expected) == {"train_loss", "train_lr"} and len(expected["train_loss"]) == 12
    got = archived(settings, run.run_id, lambda out: len(out.get("train_loss", {})) >= 12)
    assert {k: got[k] for k in expected} == expected
    # save_hyperparameters() reaches the logger after Lightning created the run: a config update
    assert run_config(read_events(settings.archive_dir, run.run_id)) == {"hidden": 4, "lr": 0.05}
    assert run.config == {"hidden": 4, "lr": 0.05}
    epochs = read_table(settings.archive_dir, run.run_id, columns=["name", "epoch"])
    assert sorted(
        {e for n, e in zip(*(epochs[c].to_pylist() for c in ("name", "epoch"))) if n == "train_loss"}
    ) == [0, 1, 2]
    # Epoch/AvgLoss per Lightning epoch: the mean of the losses Lightning logged in that epoch
    want: dict = {}
    for row in rows:
        if row.get("train_loss"):
            want.setdefault(int(row["epoch"]), []).append(float(row["train_loss"]))
    derived: dict = {}
    deadline = time.monotonic() + 60
    while len(derived.get("Epoch/AvgLoss", [])) < len(want) and time.monotonic() < deadline:
        derived = aggregates(settings, 1, timeout=5)
    loss = {p["epoch"]: (p["value"], p["source"]) for p in derived["Epoch/AvgLoss"]}
    assert loss == {e: (pytest.approx(sum(v) / len(v)), "train_loss") for e, v in want.items()}
    assert set(loss) == {0, 1, 2}  # no epoch Lightning never ran


@pytest.mark.frameworks
def test_sb3_callback_gets_every_key_sb3_writes_and_every_episode(settings, sink, worker, tmp_path):
    pytest.importorskip("stable_baselines3", reason="SB3 is an optional extra; `make test` installs it")
    from stable_baselines3 import PPO
    from stable_baselines3.common.logger import configure

    from metricbus.sb3 import MetricbusCallback

    sink(flush_interval=0.3)
    model = PPO("MlpPolicy", "CartPole-v1", n_steps=256, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.set_logger(configure(str(tmp_path / "sb3"), ["csv"]))
    callback = MetricbusCallback(project="sb3-test", settings=settings, system_metrics=False)
    model.learn(total_timesteps=2048, callback=callback)
    run = callback.run
    assert run is not None and run.config["algo"] == "PPO" and run.config["n_steps"] == 256
    assert run.name == "PPO-CartPole-v1"  # the algorithm and the environment, as SB3 users name runs

    with open(tmp_path / "sb3" / "progress.csv") as f:
        rows = list(csv.DictReader(f))
    expected: dict = {}
    for row in rows:
        step = int(row["time/total_timesteps"])
        for key, value in row.items():
            if value and not math.isnan(float(value)):
                expected.setdefault(key, {})[step] = float(value)
    assert {"rollout/ep_rew_mean", "train/loss", "time/fps"} <= set(expected)
    episodes = model.ep_info_buffer  # SB3's last 100 episodes
    got = archived(
        settings,
        run.run_id,
        lambda out: all(len(out.get(k, {})) >= len(v) for k, v in expected.items()),
    )
    for key, steps in expected.items():
        assert got[key] == pytest.approx(steps, rel=1e-6), key  # SB3's csv rounds nothing; float32 sources
    returns = [
        r for step in sorted(got["rollout/episode_return"]) for r in got["rollout/episode_return"][step]
    ]
    lengths = [
        x for step in sorted(got["rollout/episode_length"]) for x in got["rollout/episode_length"][step]
    ]
    assert sum(lengths) <= 2048 and len(returns) == len(lengths) >= len(episodes) > 0
    assert [e["r"] for e in episodes] == pytest.approx(returns[-len(episodes) :])

    # each rollout (256 timesteps) is an epoch; the worker derives Epoch/* from SB3's names through
    # the alias catalog: the episode returns are the reward, train/loss the loss
    per_step = {s: sum(rs) / len(rs) for s, rs in got["rollout/episode_return"].items()}
    want_reward, want_loss = {}, {}
    for s, mean in per_step.items():
        want_reward.setdefault(-(-s // 256), []).append(mean)
    for s, loss in got["train/loss"].items():
        want_loss[-(-s // 256)] = loss
    derived: dict = {}
    deadline = time.monotonic() + 60
    while len(derived.get("Epoch/AvgReward", [])) < len(want_reward) and time.monotonic() < deadline:
        derived = aggregates(settings, 1, timeout=5)
    reward = {p["epoch"]: (p["value"], p["source"]) for p in derived["Epoch/AvgReward"]}
    assert reward == {
        e: (pytest.approx(sum(v) / len(v)), "rollout/episode_return") for e, v in want_reward.items()
    }
    assert len(reward) == 2048 // 256
    loss = {p["epoch"]: p["value"] for p in derived["Epoch/AvgLoss"]}
    assert loss == pytest.approx(want_loss) and set(loss) == set(range(2, 9))
    assert alerts_of_closed_run(settings, run.run_id) == []  # the default rules: a healthy run


@pytest.mark.frameworks
def test_hf_trainer_callback_gets_every_log_hf_records(settings, sink, worker, tmp_path):
    pytest.importorskip("transformers", reason="transformers is an optional extra; `make test` installs it")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    from metricbus.hf import MetricbusCallback

    sink(flush_interval=0.3)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    ids = torch.randint(0, 32, (24, 16))
    data = [{"input_ids": row, "labels": row} for row in ids]  # a character-level corpus, no download
    callback = MetricbusCallback(project="hf-test", settings=settings, system_metrics=False)
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        num_train_epochs=2,  # 6 steps an epoch; a loss every 2 steps: epochs 0.33 .. 2.0 in HF's log
        per_device_train_batch_size=4,
        logging_steps=2,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        learning_rate=1e-3,
    )
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    run = callback.run
    assert run is not None and run.status == "finished"
    assert run.config["learning_rate"] == 1e-3 and run.config["model/n_layer"] == 1
    assert run.name == "out"  # no run_name: the output_dir's last part, as the Trainer names its runs

    expected: dict = {}
    for entry in trainer.state.log_history:  # HF's own record of every on_log
        for key, value in entry.items():
            if key not in ("step", "epoch") and isinstance(value, int | float):
                expected.setdefault(key, {})[entry["step"]] = float(value)
    assert {"loss", "learning_rate", "grad_norm", "train_loss"} <= set(expected)
    assert len(expected["loss"]) == 6
    got = archived(
        settings, run.run_id, lambda out: all(len(out.get(k, {})) >= len(v) for k, v in expected.items())
    )
    assert {k: got[k] for k in expected} == expected

    # HF's "loss" is the run's loss (the alias catalog): Epoch/AvgLoss per epoch the Trainer ran.
    # Its epoch is epoch + (step + 1) / steps_per_epoch: an epoch's last log reads 1.0, 2.0, ...
    want: dict = {}
    for entry in trainer.state.log_history:
        if "loss" in entry:
            want.setdefault(math.ceil(entry["epoch"]) - 1, []).append(entry["loss"])
    assert set(want) == set(range(int(args.num_train_epochs)))  # no epoch the Trainer never ran
    derived: dict = {}
    deadline = time.monotonic() + 60
    while len(derived.get("Epoch/AvgLoss", [])) < len(want) and time.monotonic() < deadline:
        derived = aggregates(settings, 1, timeout=5)
    loss = {p["epoch"]: (p["value"], p["source"]) for p in derived["Epoch/AvgLoss"]}
    assert loss == {e: (pytest.approx(sum(v) / len(v)), "loss") for e, v in want.items()}
    assert alerts_of_closed_run(settings, run.run_id) == []  # the default rules: a healthy run


@pytest.mark.frameworks
def test_hf_report_to_metricbus_is_registered(settings, sink, tmp_path, monkeypatch):
    pytest.importorskip("transformers", reason="transformers is an optional extra; `make test` installs it")
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    import metricbus.hf  # noqa: F401 - registers report_to="metricbus"

    for key, value in {**settings.to_env(), "METRICBUS_PROJECT": "hf-report-to"}.items():
        monkeypatch.setenv(key, value)
    sink(flush_interval=0.3)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=32, n_positions=16, n_embd=16, n_layer=1, n_head=2))
    ids = torch.randint(0, 32, (8, 16))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=2,
        per_device_train_batch_size=4,
        logging_steps=1,
        report_to=["metricbus"],
        run_name="via-report-to",
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=args, train_dataset=[{"input_ids": r, "labels": r} for r in ids])
    (callback,) = [c for c in trainer.callback_handler.callbacks if type(c).__name__ == "MetricbusCallback"]
    trainer.train()
    assert (
        callback.run is not None
        and callback.run.project == "hf-report-to"
        and callback.run.name == "via-report-to"
    )
    got = archived(settings, callback.run.run_id, lambda out: len(out.get("loss", {})) >= 2)
    assert sorted(got["loss"]) == [1, 2]


def _char_tokenizer():
    """A character-level tokenizer built here (no download)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = "abcdefghijklmnopqrstuvwxyz "
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2, **{c: i + 3 for i, c in enumerate(chars)}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


@pytest.mark.frameworks
def test_trl_grpo_gets_seed_002_names_and_every_samples_score(settings, sink, worker, tmp_path):
    pytest.importorskip("trl", reason="TRL is an optional extra (metricbus[trl]); `make test` installs it")
    import torch
    from datasets import Dataset
    from transformers import GPT2Config, GPT2LMHeadModel
    from trl import GRPOConfig, GRPOTrainer

    from metricbus.hf import MetricbusCallback

    sink(flush_interval=0.3)
    torch.manual_seed(0)
    tokenizer = _char_tokenizer()
    model = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=30, n_positions=64, n_embd=16, n_layer=1, n_head=2, pad_token_id=0, eos_token_id=1
        )
    )

    def length_reward(completions, **kwargs):
        return [len(c) / 8 for c in completions]

    def a_reward(completions, **kwargs):  # seed 002: a function that cannot score a sample says None
        return [None if i == 0 else c.count("a") / 8 for i, c in enumerate(completions)]

    callback = MetricbusCallback(project="grpo-test", settings=settings, system_metrics=False)
    args = GRPOConfig(
        output_dir=str(tmp_path / "out"),
        max_steps=3,
        per_device_train_batch_size=4,
        num_generations=4,
        max_completion_length=8,
        logging_steps=1,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=callback.rewards([length_reward, a_reward]),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["abc", "hello", "xyz", "grpo"] * 4}),
        processing_class=tokenizer,
        callbacks=[callback],
    )
    trainer.train()
    run = callback.run
    assert run is not None and run.status == "finished"
    history = [e for e in trainer.state.log_history if "reward" in e]
    assert [e["step"] for e in history] == [1, 2, 3]

    got = archived(settings, run.run_id, lambda out: len(out.get("rewards/a_reward", {})) >= 3)
    assert sorted(got["rewards/length_reward"]) == [1, 2, 3]  # every score, at the step TRL logs it
    assert all(len(scores) == 4 for scores in got["rewards/length_reward"].values())
    assert {s: e["reward"] for s, e in zip([1, 2, 3], history, strict=True)} == pytest.approx(got["reward"])
    assert "rewards/length_reward_mean" not in got and "rewards/length_reward/mean" not in got
    # the sampled completions beside their scores: a table and a text sample per step
    from metricbus.schemas import MEDIA, TABLE, MediaStore

    deadline = time.monotonic() + 30  # the text samples come through the media thread: a flush later
    while True:
        events = read_events(settings.archive_dir, run.run_id)
        if sum(e.kind == MEDIA for e in events) >= 3 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    tables = {e.body["step"]: e.body for e in events if e.kind == TABLE and e.body["name"] == "completions"}
    assert sorted(tables) == [1, 2, 3]
    table = tables[1]
    assert (
        table["columns"] == ["prompt", "completion", "a_reward", "length_reward"] and len(table["rows"]) == 4
    )
    assert table["rows"][0][2] is None  # a_reward cannot score the first sample: an empty cell
    for prompt, completion, _, length in table["rows"]:
        assert prompt in ("abc", "hello", "xyz", "grpo") and length == pytest.approx(len(completion) / 8)
    samples = [e.body for e in events if e.kind == MEDIA]
    assert [b["step"] for b in samples] == [1, 2, 3] and samples[0]["caption"].startswith("a_reward none")
    text = MediaStore.of(settings).get(samples[0]["ref"]).decode()
    assert text == f"{table['rows'][0][0]}\n---\n{table['rows'][0][1]}"

    # the worker derives seed 002's series from the samples: equal to TRL's own means
    derived: dict = {}
    deadline = time.monotonic() + 60
    while len(derived.get("final/a_reward_total_samples", [])) < 1 and time.monotonic() < deadline:
        derived = aggregates(settings, 1, timeout=5)
    means = {p["step"]: p["value"] for p in derived["rewards/length_reward_mean"]}
    assert means == pytest.approx({e["step"]: e["rewards/length_reward/mean"] for e in history}, rel=1e-6)
    a_means = {p["step"]: p["value"] for p in derived["rewards/a_reward_mean"]}
    assert a_means == pytest.approx({e["step"]: e["rewards/a_reward/mean"] for e in history}, rel=1e-6)
    assert derived["final/a_reward_total_samples"][-1]["value"] == 12  # NaN-scored ones counted
    assert derived["final/a_reward_nonfinite_samples"][-1]["value"] == 3
    totals = {p["step"]: p["value"] for p in derived["rewards/total_mean"]}  # seed 002: sum of the means
    assert totals == pytest.approx({s: means[s] + a_means[s] for s in means}, rel=1e-9)
    # the Trainer's epochs (3 steps of a 16-prompt epoch: all in its first): Epoch/AvgLoss of
    # epoch 0 is the mean of the losses TRL logged, and no other epoch appears
    closing: dict = {}
    deadline = time.monotonic() + 60
    while not closing.get("Epoch/AvgLoss") and time.monotonic() < deadline:
        closing = aggregates(settings, 1, timeout=5)
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    assert [(p["epoch"], p["source"]) for p in closing["Epoch/AvgLoss"]] == [(0, "loss")]
    assert closing["Epoch/AvgLoss"][0]["value"] == pytest.approx(sum(losses) / len(losses))
    assert alerts_of_closed_run(settings, run.run_id) == []  # the default rules: a healthy run


def test_a_cleanrl_style_loop_gets_epochs_of_its_own_updates(settings, worker):
    """A plain PyTorch loop in CleanRL's shape (its names; an update of several minibatch epochs
    is our epoch, passed as ``epoch=``): per update, Epoch/AvgLoss and Epoch/AvgReward equal the
    means pandas computes from what the loop itself logged; no extra epoch."""
    pd = pytest.importorskip("pandas", reason="pandas is a test dependency of `make test`")
    import torch

    from metricbus.producers import Run

    torch.manual_seed(3)
    run = Run("cleanrl-style", settings=settings, system_metrics=False)
    policy = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(policy.parameters(), lr=0.01)
    logged: list[tuple[int, int, str, float]] = []  # (update, step, name, value): the loop's own record
    global_step = 0
    for update in range(4):
        for _ in range(8):  # rollout: episodes end now and then, with a return
            global_step += 16
            episodic_return = float(torch.rand(()) * 10 + update)
            run.log({"charts/episodic_return": episodic_return}, step=global_step, epoch=update)
            logged.append((update, global_step, "charts/episodic_return", episodic_return))
        for _ in range(3):  # update epochs over minibatches, logged at the update's step
            obs = torch.randn(16, 4)
            loss = torch.nn.functional.cross_entropy(policy(obs), torch.randint(0, 2, (16,)))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            global_step += 1
            run.log({"losses/loss": loss.item()}, step=global_step, epoch=update)
            logged.append((update, global_step, "losses/loss", loss.item()))
    assert run.finish(timeout=30)

    frame = pd.DataFrame(logged, columns=["update", "step", "name", "value"])
    want = frame.groupby(["name", "update"])["value"].mean()
    derived: dict = {}
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (
        len(derived.get("Epoch/AvgLoss", [])) < 4 or len(derived.get("Epoch/AvgReward", [])) < 4
    ):
        derived = aggregates(settings, 1, timeout=5)
    loss = {p["epoch"]: (p["value"], p["source"]) for p in derived["Epoch/AvgLoss"]}
    reward = {p["epoch"]: (p["value"], p["source"]) for p in derived["Epoch/AvgReward"]}
    assert loss == {u: (pytest.approx(want["losses/loss"][u]), "losses/loss") for u in range(4)}
    assert reward == {
        u: (pytest.approx(want["charts/episodic_return"][u]), "charts/episodic_return") for u in range(4)
    }
