"""The SummaryWriter drop-in names the run after the log_dir torch users pass and says where the files are."""

import re

from metricbus.schemas import Settings
from metricbus.tensorboard import SummaryWriter


def test_the_log_dir_names_the_run_and_the_writer_says_where_tensorboard_reads_it(tmp_path, capsys):
    writer = SummaryWriter(
        "runs/exp-lr0.1", settings=Settings(data_dir=tmp_path, offline=True), system_metrics=False
    )
    writer.add_scalar("Train/Loss", 0.5, 1)
    assert writer.run.name == "exp-lr0.1"
    err = capsys.readouterr().err
    assert "nothing is written under runs/exp-lr0.1" in err
    # the project is the log_dir's parent, "runs", as torch's own default directory says
    assert (
        f"`tensorboard --logdir {tmp_path / 'tensorboard'}`" in err
        and str(tmp_path / "tensorboard" / "runs") in err
    )
    writer.close()


def test_without_a_log_dir_the_run_is_named_as_torch_names_its_directory(tmp_path, capsys):
    writer = SummaryWriter(
        comment="_lr0.1", settings=Settings(data_dir=tmp_path, offline=True), system_metrics=False
    )
    writer.add_scalar("x", 1.0, 0)
    assert re.fullmatch(r"[A-Z][a-z]{2}\d{2}_\d{2}-\d{2}-\d{2}_.+_lr0\.1", writer.run.name), writer.run.name
    assert writer.log_dir.startswith("runs/")
    writer.close()


def test_the_project_is_the_log_dirs_parent_and_the_run_its_last_part(tmp_path, monkeypatch):
    """``logs/ppo/lr3e-4``: project ppo, run lr3e-4, as TensorBoard shows the directories."""
    monkeypatch.delenv("METRICBUS_PROJECT", raising=False)
    settings = Settings(data_dir=tmp_path, offline=True)
    writer = SummaryWriter(log_dir="logs/ppo/lr3e-4", settings=settings, system_metrics=False)
    writer.add_scalar("Train/Loss", 1.0, 0)
    assert (writer.run.project, writer.run.name) == ("ppo", "lr3e-4")
    writer.close()
    explicit = SummaryWriter(
        log_dir="logs/ppo/lr1e-3", project="sweep", settings=settings, system_metrics=False
    )
    explicit.add_scalar("Train/Loss", 1.0, 0)
    assert explicit.run.project == "sweep"
    explicit.close()
