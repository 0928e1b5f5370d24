"""metricbus: training metrics as events — log in microseconds, lose nothing, replay anywhere.

::

    import metricbus
    run = metricbus.init(project="cartpole", config={"lr": 3e-4})
    for step in range(1000):
        run.log({"Train/Loss": loss, "Train/AvgReward": reward}, step=step)
    run.finish()
"""

from __future__ import annotations

import typing
from collections.abc import Iterable, Mapping
from typing import Any

from metricbus.schemas import (
    BrokerError,
    ConfigError,
    EncodeError,
    InvalidNameError,
    MetricbusError,
    MetricValueError,
    PortInUseError,
    SchemaError,
    Settings,
)

if typing.TYPE_CHECKING:
    from metricbus.producers import Run

__version__ = "0.1.0"

_current: Run | None = None


def init(
    project: str,
    name: str | None = None,
    config: Any = None,
    tags: Iterable[str] = (),
    run_id: str | None = None,
    **options: Any,
) -> Run:
    """Start a run and make it the current one for :func:`log` / :func:`finish`.

    ``options`` go to :class:`Run` (settings, strict, system_metrics, system_interval_s, rank,
    world_size). Never contacts Kafka synchronously: with no broker reachable the run spools
    locally and says so once.
    """
    from metricbus.producers import Run

    global _current
    _current = Run(project, name=name, config=config, tags=tags, run_id=run_id, **options)
    return _current


def log(data: Mapping[str, Any], step: int | None = None, epoch: int | None = None) -> None:
    """``log`` on the current run (see :meth:`Run.log`)."""
    if _current is None:
        raise ConfigError("metricbus.log() was called before metricbus.init(); call init() first")
    _current.log(data, step=step, epoch=epoch)


def finish(status: str = "finished", timeout: float = 10.0) -> bool:
    """``finish`` the current run (see :meth:`Run.finish`); True when everything was delivered."""
    global _current
    if _current is None:
        return True
    run, _current = _current, None
    return run.finish(status=status, timeout=timeout)


def history(run: str, metrics: Any = None, derived: bool = True, wide: bool = True, **kw: Any) -> Any:
    """One run's scalars from the archive as a pandas DataFrame (see ``metricbus._history``)."""
    from metricbus._history import history as read

    return read(run, metrics=metrics, derived=derived, wide=wide, **kw)


def curves(project: str | None, metric: str, **kw: Any) -> Any:
    """One metric of a project's runs as group means and bands (see ``metricbus._history``)."""
    from metricbus._history import curves as read

    return read(project, metric, **kw)


def runs(project: str | None = None, **kw: Any) -> Any:
    """Every run in the archive as a pandas DataFrame (see ``metricbus._history``)."""
    from metricbus._history import runs as read

    return read(project=project, **kw)


def __getattr__(name: str) -> Any:
    """``metricbus.Run``, imported on first use.

    Importing metricbus for its errors and settings, as the command line does, loads no producer.
    """
    if name == "Run":
        from metricbus.producers import Run

        return Run
    raise AttributeError(f"module 'metricbus' has no attribute {name!r}")


__all__ = [
    "BrokerError",
    "ConfigError",
    "EncodeError",
    "InvalidNameError",
    "MetricValueError",
    "MetricbusError",
    "PortInUseError",
    "Run",
    "SchemaError",
    "Settings",
    "__version__",
    "curves",
    "finish",
    "history",
    "init",
    "log",
    "runs",
]
