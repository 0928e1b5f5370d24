"""Hugging Face ``Trainer`` (and TRL's trainers, which are Trainers) (the ``hf`` extra).

    from metricbus.hf import MetricbusCallback
    trainer = Trainer(..., callbacks=[MetricbusCallback(project="sft")])

At train begin the run starts with the ``TrainingArguments`` and the model's config as its
config; every ``on_log`` arrives at ``state.global_step`` (``epoch`` as the events' epoch, a
float in HF: its integer part); train end finishes the run. Only the global process zero logs,
unless ``all_ranks=True`` (then every rank logs as its own rank of one run).

Importing this module also registers ``report_to="metricbus"`` with transformers (project from
``$METRICBUS_PROJECT``, else "huggingface"; the run named after ``run_name``).
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any

from transformers import TrainerCallback

from ._run import Run


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in d.items():
        if isinstance(value, str | bool | numbers.Real) or value is None:
            out[key] = value
        elif isinstance(value, list | tuple) and all(isinstance(v, str | numbers.Real) for v in value):
            out[key] = list(value)
        else:
            out[key] = str(value)
    return out


class MetricbusCallback(TrainerCallback):  # type: ignore[misc]
    """Publishes a Trainer's logs to metricbus (see the module doc)."""

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        all_ranks: bool = False,
        **init_options: Any,
    ) -> None:
        self._project = project or os.environ.get("METRICBUS_PROJECT") or "huggingface"
        self._name = name
        self._all_ranks = all_ranks
        self._options = init_options
        self.run: Run | None = None

    def _logs_here(self, state: Any) -> bool:
        return self._all_ranks or bool(getattr(state, "is_world_process_zero", True))

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        """Start the run: config = TrainingArguments + the model's config (under ``model/``)."""
        if self.run is not None or not self._logs_here(state):
            return
        config = _jsonable(args.to_dict())
        model_config = getattr(model, "config", None)
        if model_config is not None and hasattr(model_config, "to_dict"):
            config.update({f"model/{k}": v for k, v in _jsonable(model_config.to_dict()).items()})
        name = self._name or (getattr(args, "run_name", None) or None)
        self.run = Run(self._project, name=name, config=config, **self._options)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Every numeric key of ``logs`` at ``state.global_step``."""
        if self.run is None or not logs:
            return
        data = {
            k: float(v)
            for k, v in logs.items()
            if isinstance(v, numbers.Real) and not isinstance(v, bool) and k != "epoch"
        }
        epoch = logs.get("epoch")
        whole = int(float(epoch)) if isinstance(epoch, numbers.Real) and math.isfinite(epoch) else None
        if data:
            self.run.log(data, step=int(state.global_step), epoch=whole)

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Finish the run."""
        if self.run is not None:
            self.run.finish()


def _register() -> None:
    """``report_to="metricbus"``: transformers looks report_to names up in this table."""
    try:
        from transformers.integrations import integration_utils
    except ImportError:  # a transformers without the table: pass the callback instead
        return
    integration_utils.INTEGRATION_TO_CALLBACK.setdefault("metricbus", MetricbusCallback)


_register()

__all__ = ["MetricbusCallback"]
