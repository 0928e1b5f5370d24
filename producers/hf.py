"""Hugging Face ``Trainer`` (and TRL's trainers, which are Trainers) (the ``hf`` extra).

    from metricbus.hf import MetricbusCallback
    trainer = Trainer(..., callbacks=[MetricbusCallback(project="sft")])

At train begin the run starts with the ``TrainingArguments`` and the model's config as its
config; every ``on_log`` arrives at ``state.global_step``, in the epoch that step belongs to
(``producers._epochs.trainer_epoch``); train end finishes the run. Only the global process zero logs,
unless ``all_ranks=True`` (then every rank logs as its own rank of one run).

Importing this module also registers ``report_to="metricbus"`` with transformers (project from
``$METRICBUS_PROJECT``, else "huggingface"; the run named after ``run_name``, else the last
part of ``output_dir``).

TRL (GRPO and friends): its per-function reward means arrive under the GRPO reward metrics' names
(``rewards/{func}/mean`` -> ``rewards/{func}_mean``, ``/std`` -> ``_std``). To publish every
sample's score, so the stream derives ``rewards/{func}_mean/_std/_min/_max``, ``_recent_mean``,
``_hist``, ``rewards/total_mean`` and ``final/{func}_*`` from all of them, wrap the reward
functions::

    callback = MetricbusCallback(project="grpo")
    trainer = GRPOTrainer(..., reward_funcs=callback.rewards([format_reward, answer_reward]),
                          callbacks=[callback])

A wrapped function returns what it returned; its scores (``None`` -> NaN: kept and counted, as
seed 002 counts NaN-scored samples) are logged as ``rewards/{func}`` samples, every function's
in one event after the optimizer step, at the step TRL logs that batch's metrics (TRL's own
mean and std of that function are then left out: the worker derives them from the samples).
Reward models (not Python functions) are passed through.

The wrapped functions also see the batch's prompts and completions: at each such step the first
``completions`` of them (4 by default; 0 for none) are logged next to their scores, as a
``completions`` table (prompt, completion, a column per function) that every sink shows, and the
first one as a text sample (``completions/sample``: the dashboard's Media panel pages through it
by step), so the curves can be read with what the model wrote.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import re
from collections.abc import Callable, Sequence
from typing import Any

from transformers import TrainerCallback

from ._epochs import trainer_epoch
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


def _run_name(args: Any) -> str | None:
    """The run's name as the Trainer names it: ``run_name``, else ``output_dir``'s last part.

    transformers' own default for ``run_name`` is ``output_dir`` (a path): its last part.
    """
    import os

    for given in (getattr(args, "run_name", None), getattr(args, "output_dir", None)):
        if given:
            return os.path.basename(os.path.normpath(str(given))) or str(given)
    return None


class MetricbusCallback(TrainerCallback):  # type: ignore[misc]
    """Publishes a Trainer's logs to metricbus (see the module doc)."""

    def __init__(
        self,
        project: str | None = None,
        name: str | None = None,
        all_ranks: bool = False,
        completions: int = 4,
        **init_options: Any,
    ) -> None:
        self._project = project or os.environ.get("METRICBUS_PROJECT") or "huggingface"
        self._name = name
        self._all_ranks = all_ranks
        self._options = init_options
        self.run: Run | None = None
        self._sampled: set[str] = set()  # reward functions whose every score is published
        self._scores: dict[str, list[float]] = {}  # scored since the last optimizer step
        self._completions = completions  # sampled completions logged per step
        self._texts: list[tuple[str, str]] = []  # this step's first (prompt, completion) pairs

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
        self.run = Run(self._project, name=self._name or _run_name(args), config=config, **self._options)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        """Every numeric key of ``logs`` at ``state.global_step``."""
        if self.run is None or not logs:
            return
        data = {}
        for k, v in logs.items():
            if not isinstance(v, numbers.Real) or isinstance(v, bool) or k == "epoch":
                continue
            trl = _TRL_REWARD.fullmatch(k)
            if trl is not None:  # seed 002's name; left to the worker when every score is sent
                if trl["func"] in self._sampled:
                    continue
                k = f"rewards/{trl['func']}_{trl['stat']}"
            data[k] = float(v)
        if data:
            self.run.log(data, step=int(state.global_step), epoch=trainer_epoch(state.epoch))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Publish the scores of this step's batches at the step TRL logs their metrics.

        Every reward function's in one event, so the stream's ``rewards/total_mean`` sums them.
        """
        scores, self._scores = self._scores, {}
        texts, self._texts = self._texts, []
        if scores and self.run is not None:
            step = int(state.global_step)
            self.run.log({f"rewards/{name}": values for name, values in scores.items()}, step=step)
            if texts:
                names = sorted(scores)
                rows = [
                    [prompt, completion, *(_cell(scores[n], i) for n in names)]
                    for i, (prompt, completion) in enumerate(texts)
                ]
                self.run.log_table("completions", ["prompt", "completion", *names], rows, step=step)
                prompt, completion = texts[0]
                marks = ", ".join(f"{n} {_cell(scores[n], 0)}".replace(" None", " none") for n in names)
                sample = f"{prompt}\n---\n{completion}"
                self.run.log_text("completions/sample", sample, step=step, caption=marks)

    def rewards(self, funcs: Callable[..., Any] | Sequence[Any]) -> Any:
        """TRL reward functions that also publish every score (see the module doc)."""
        if callable(funcs) and not isinstance(funcs, Sequence):
            return self._reward(funcs)
        return [self._reward(f) for f in funcs]

    def _reward(self, func: Any) -> Any:
        if not callable(func) or not hasattr(func, "__name__") or hasattr(func, "config"):
            return func  # a reward model: TRL scores with it, nothing to wrap
        name = func.__name__
        self._sampled.add(name)

        @functools.wraps(func)
        def scored(*args: Any, **kwargs: Any) -> Any:
            scores = func(*args, **kwargs)
            try:
                if scores is not None and self.run is not None:
                    if not self._scores:  # the step's first batch, its first function: what it scored
                        prompts, completions = kwargs.get("prompts") or [], kwargs.get("completions") or []
                        pairs = zip(prompts, completions, strict=False)
                        self._texts = [(_text(p), _text(c)) for p, c in pairs][: self._completions]
                    kept = self._scores.setdefault(name, [])
                    kept.extend(math.nan if s is None else s for s in scores)
            except TypeError:  # not a list of numbers: TRL will say so itself
                pass
            return scores

        return scored

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Finish the run."""
        if self.run is not None:
            self.run.finish()


def _text(value: Any) -> str:
    """A prompt or completion as text: a string, or a conversation's messages one a line."""
    if isinstance(value, list):
        return "\n".join(
            f"{m.get('role', '?')}: {m.get('content', '')}" if isinstance(m, dict) else str(m) for m in value
        )
    return str(value)


def _cell(scores: list[float], i: int) -> float | None:
    """Sample ``i``'s score (None when it has none, or it is NaN: a table cell)."""
    value = scores[i] if i < len(scores) else math.nan
    return None if not isinstance(value, numbers.Real) or math.isnan(value) else float(value)


_TRL_REWARD = re.compile(r"rewards/(?P<func>[^/]+)/(?P<stat>mean|std)")


def _register() -> None:
    """``report_to="metricbus"``: transformers looks report_to names up in this table."""
    try:
        from transformers.integrations import integration_utils
    except ImportError:  # a transformers without the table: pass the callback instead
        return
    integration_utils.INTEGRATION_TO_CALLBACK.setdefault("metricbus", MetricbusCallback)


_register()

__all__ = ["MetricbusCallback"]
