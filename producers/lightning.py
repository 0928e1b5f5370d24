"""A Lightning ``Logger`` that publishes to metricbus (the ``lightning`` extra).

    from metricbus.lightning import MetricbusLogger
    trainer = Trainer(logger=MetricbusLogger(project="mnist"))

Metrics arrive at Lightning's ``step`` (its ``epoch`` key becomes the events' epoch), and
``finalize`` finishes the run with Lightning's status. The hyperparameters from
``save_hyperparameters()`` become the run's config: Lightning creates the experiment before it
logs them, so they arrive as a config update right after the run's start (every sink merges it
into the run's config). Only the global-zero process logs, as Lightning's own loggers do.
Media: ``log_image``, ``log_video``, ``log_audio`` and ``log_text`` take the arguments of
Lightning's ``WandbLogger`` (a key, a list, ``step=``, ``caption=``); several items of one key are
``<key>/<i>``.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict, _sanitize_callable_params
from lightning.pytorch.loggers.logger import Logger, rank_zero_experiment
from lightning.pytorch.utilities import rank_zero_only

from ._epochs import counted_epoch
from ._run import Run


class MetricbusLogger(Logger):
    """Lightning's Logger interface over a :class:`producers.Run` (started at first use)."""

    def __init__(
        self,
        project: str = "lightning",
        name: str | None = None,
        run_id: str | None = None,
        **init_options: Any,
    ) -> None:
        super().__init__()
        self._project = project
        self._name = name
        self._run_id = run_id
        self._options = init_options
        self._config: dict[str, Any] = {}
        self._run: Run | None = None

    @property
    def name(self) -> str:
        """The run's name (else the project)."""
        return self._name or self._project

    @property
    def version(self) -> str:
        """The run id, once the run started."""
        return self._run.run_id if self._run is not None else (self._run_id or "")

    @property
    @rank_zero_experiment
    def experiment(self) -> Run:
        """The metricbus run (started on first use, with the hyperparameters known by then)."""
        if self._run is None:
            self._run = Run(
                self._project, name=self._name, config=self._config, run_id=self._run_id, **self._options
            )
        return self._run

    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """The run's config: its start config before the run exists, else a config update."""
        flat = _flatten_dict(_sanitize_callable_params(_convert_params(params)))
        if self._run is None:
            self._config.update(flat)
        else:
            self._run.config.update(flat)

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Scalars at Lightning's step; its ``epoch`` key becomes the events' epoch."""
        data = {}
        epoch = None
        for key, value in metrics.items():
            number = float(value.item() if hasattr(value, "item") else value)
            if key == "epoch":
                epoch = counted_epoch(number)
            else:
                data[key] = number
        if data:
            self.experiment.log(data, step=step, epoch=epoch)

    @rank_zero_only
    def log_image(self, key: str, images: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Images (arrays, tensors, PIL images, figures or paths) at ``step``; ``caption=[...]``."""
        self._media(self.experiment.log_image, key, images, step, kwargs)

    @rank_zero_only
    def log_video(self, key: str, videos: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Videos (TxHxWxC or TxCxHxW frames, or GIF paths); ``fps=[...]``, ``caption=[...]``."""
        self._media(self.experiment.log_video, key, videos, step, kwargs)

    @rank_zero_only
    def log_audio(self, key: str, audios: list[Any], step: int | None = None, **kwargs: Any) -> None:
        """Clips (samples or WAV paths); ``sample_rate=[...]``, ``caption=[...]``."""
        options = {("rate" if k == "sample_rate" else k): v for k, v in kwargs.items()}
        self._media(self.experiment.log_audio, key, audios, step, options)

    @rank_zero_only
    def log_text(self, key: str, texts: list[str] | str, step: int | None = None, **kwargs: Any) -> None:
        """Text samples (a sampled completion, a prompt)."""
        self._media(self.experiment.log_text, key, texts, step, kwargs)

    @staticmethod
    def _media(log: Any, key: str, items: Any, step: int | None, options: Mapping[str, Any]) -> None:
        items = items if isinstance(items, list) else [items]
        for i, item in enumerate(items):
            # per-item options are lists (WandbLogger's); one value goes to every item
            kwargs = {k: v[i] if isinstance(v, list) else v for k, v in options.items()}
            log(key if len(items) == 1 else f"{key}/{i}", item, step=step, **kwargs)

    @rank_zero_only
    def finalize(self, status: str) -> None:
        """Finish the run ("success" -> finished; else Lightning's status)."""
        if self._run is not None:
            self._run.finish(status="finished" if status == "success" else status)
