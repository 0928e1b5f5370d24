"""``run.watch(model)``: gradient norms (total and per layer), histograms, learning rates.

After every ``every``-th backward pass (the autograd engine's end-of-backward callback, queued
from the first parameter whose gradient was accumulated), it logs, from ``param.grad`` as it
then is (accumulated, before any clipping or optimizer step):

- ``grad/total_norm``: the 2-norm over every gradient, the figure ``clip_grad_norm_`` returns;
- ``grad/<layer>/norm`` per module that owns parameters (at most ``max_layers`` of them);
- ``grad/nonfinite``: 1 when any gradient holds NaN or inf (the default rules alert on it, and on
  a non-finite ``grad/total_norm``), else 0;
- with ``log="parameters"`` or ``"all"`` a histogram per parameter tensor (``parameters/<name>``),
  with ``"gradients"`` or ``"all"`` one per gradient (``gradients/<name>``);
- with ``optimizer=``, ``lr/group<i>`` for each parameter group.

The step is the run's current step (the last one logged) unless ``step=`` gives a callable.
Costs one norm per parameter tensor on every ``every``-th backward; never raises into training.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

log = logging.getLogger("metricbus")


class Watcher:
    """Hooks on one model; :meth:`remove` takes them off."""

    def __init__(
        self,
        run: Any,
        model: Any,
        log_what: str = "gradients",
        every: int = 100,
        optimizer: Any = None,
        step: Callable[[], int] | None = None,
        max_layers: int = 200,
    ) -> None:
        if log_what not in ("gradients", "parameters", "all"):
            raise ValueError(f"log={log_what!r}: one of 'gradients', 'parameters', 'all'")
        self.run = run
        self.model = model
        self.log_what = log_what
        self.every = max(1, int(every))
        self.optimizer = optimizer
        self.step_fn = step
        self.backwards = 0
        self._queued = False
        self._named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        layers: dict[str, list[Any]] = {}
        for name, p in self._named:
            layers.setdefault(name.rpartition(".")[0] or name, []).append(p)
        self._layers = list(layers.items())[:max_layers]
        self._handles = [p.register_post_accumulate_grad_hook(self._accumulated) for _, p in self._named]

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def _accumulated(self, param: Any) -> None:
        if self._queued:
            return
        self._queued = True
        from torch.autograd import Variable

        Variable._execution_engine.queue_callback(self._backward_done)

    def _backward_done(self) -> None:
        self._queued = False
        self.backwards += 1
        if (self.backwards - 1) % self.every:
            return
        try:
            self._log()
        except Exception as exc:  # noqa: BLE001 - never into the training loop
            self.run._guard.skipped("watch", exc)

    def _step(self) -> int:
        if self.step_fn is not None:
            return int(self.step_fn())
        return max(self.run._step - 1, 0)

    def _log(self) -> None:
        import torch

        step = self._step()
        data: dict[str, float] = {}
        with torch.no_grad():
            for layer, params in self._layers:
                grads = [torch.linalg.vector_norm(p.grad, 2.0) for p in params if p.grad is not None]
                if grads:
                    data[f"grad/{layer}/norm"] = float(torch.linalg.vector_norm(torch.stack(grads), 2.0))
            norms = [torch.linalg.vector_norm(p.grad, 2.0) for _, p in self._named if p.grad is not None]
            if norms:  # clip_grad_norm_'s figure: the 2-norm of the per-tensor 2-norms
                total = float(torch.linalg.vector_norm(torch.stack(norms), 2.0))
                data["grad/total_norm"] = total
                data["grad/nonfinite"] = 0.0 if math.isfinite(total) else 1.0
        if self.optimizer is not None:
            for i, group in enumerate(self.optimizer.param_groups):
                lr = group.get("lr")
                if isinstance(lr, int | float):
                    data[f"lr/group{i}"] = float(lr)
        if data:
            self.run.log(data, step=step)
        for name, p in self._named:
            if self.log_what in ("parameters", "all"):
                self.run.log_histogram(f"parameters/{name}", p.detach(), step=step)
            if self.log_what in ("gradients", "all") and p.grad is not None:
                self.run.log_histogram(f"gradients/{name}", p.grad.detach(), step=step)
