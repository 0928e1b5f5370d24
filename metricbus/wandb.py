"""``import metricbus.wandb as wandb``: the wandb calls training scripts use, publishing to metricbus.

``init``, ``log`` (``step``, ``commit``), ``config`` (``update``, attributes), ``summary``,
``define_metric``, ``Histogram``, ``Table``, ``Image``, ``Video``, ``Audio``, ``Html``, ``finish``,
and ``run``. See
:mod:`producers._wandb_api` for the step rules and what is said once and not carried.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from metricbus.producers import WandbAudio as Audio
from metricbus.producers import WandbHistogram as Histogram
from metricbus.producers import WandbHtml as Html
from metricbus.producers import WandbImage as Image
from metricbus.producers import WandbRun, wandb_init
from metricbus.producers import WandbTable as Table
from metricbus.producers import WandbVideo as Video

run: WandbRun | None = None


def init(*args: Any, **kwargs: Any) -> WandbRun:
    """Start a run (``wandb.init``'s project, name, config, tags, id); it becomes ``wandb.run``."""
    global run
    if run is not None:
        run.finish()
    run = wandb_init(*args, **kwargs)
    return run


def _current(what: str) -> WandbRun:
    if run is None:
        from metricbus.schemas import ConfigError

        raise ConfigError(f"metricbus.wandb.{what}() was called before metricbus.wandb.init()")
    return run


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
    """``wandb.log`` on the current run."""
    _current("log").log(data, step=step, commit=commit)


def define_metric(name: str, step_metric: str | None = None, **kwargs: Any) -> None:
    """Accepted (said once): metricbus plots every series against its step."""
    _current("define_metric").define_metric(name, step_metric=step_metric, **kwargs)


def watch(*args: Any, **kwargs: Any) -> None:
    """Not carried yet (said once, counted)."""
    _current("watch").watch(*args, **kwargs)


def alert(*args: Any, **kwargs: Any) -> None:
    """Not carried (said once, counted): metricbus alerts come from rules."""
    _current("alert").alert(*args, **kwargs)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """Finish the current run (nothing to do without one)."""
    global run
    if run is not None:
        current, run = run, None
        current.finish(exit_code=exit_code)


def __getattr__(name: str) -> Any:
    if name in ("config", "summary"):  # the current run's, as wandb.config / wandb.summary are
        return getattr(_current(name), name)
    raise AttributeError(name)


__all__ = [
    "Audio",
    "Histogram",
    "Html",
    "Image",
    "Table",
    "Video",
    "WandbRun",
    "alert",
    "define_metric",
    "finish",
    "init",
    "log",
    "run",
    "watch",
]
