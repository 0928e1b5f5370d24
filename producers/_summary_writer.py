"""A drop-in for ``torch.utils.tensorboard.SummaryWriter``: switch a script with one import line.

    from metricbus.tensorboard import SummaryWriter   # was: from torch.utils.tensorboard import ...

Scalars, scalar groups, histograms, text and hparams become metricbus events; the TensorBoard
sink (and every other sink) shows them. What metricbus does not carry yet (images, figures,
audio, video, graphs, embeddings, PR curves, meshes) is said once per kind and counted in
``writer.unsupported``, never silently dropped. ``walltime`` is accepted; the event keeps the
time of the call (said once when a caller passes one).

The run starts at the first call: project from ``project=`` or ``$METRICBUS_PROJECT`` (else
"tensorboard"), name from the ``log_dir``'s last part (torch's default ``runs/<date>_<host>``
when none is given), so TensorBoard's run directory names carry over; it says in one line where
the stack's TensorBoard sink writes the files, since nothing is written under ``log_dir``. Like
every metricbus call, no method raises into the training loop.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._run import Run

log = logging.getLogger("metricbus")

UNSUPPORTED = (
    "add_image",
    "add_images",
    "add_image_with_boxes",
    "add_figure",
    "add_video",
    "add_audio",
    "add_graph",
    "add_embedding",
    "add_pr_curve",
    "add_pr_curve_raw",
    "add_mesh",
    "add_onnx_graph",
    "add_custom_scalars",
)


def _float(value: Any) -> float:
    if hasattr(value, "item"):  # a 0-d tensor or numpy scalar
        value = value.item()
    return float(value)


class SummaryWriter:
    """torch's ``SummaryWriter`` signature, publishing to metricbus."""

    def __init__(
        self,
        log_dir: str | None = None,
        comment: str = "",
        purge_step: int | None = None,
        max_queue: int = 10,
        flush_secs: int = 120,
        filename_suffix: str = "",
        *,
        project: str | None = None,
        run: Run | None = None,
        **init_options: Any,
    ) -> None:
        if not log_dir:  # torch's own default: runs/<month><day>_<time>_<host><comment>
            stamp = datetime.datetime.now().strftime("%b%d_%H-%M-%S")
            log_dir = os.path.join("runs", f"{stamp}_{socket.gethostname()}{comment}")
        self.log_dir = log_dir
        self._name = Path(log_dir).name or None
        self._project = project or os.environ.get("METRICBUS_PROJECT") or "tensorboard"
        self._options = init_options
        self._run = run
        self._config: dict[str, Any] = {}
        self._said: set[str] = set()
        #: calls metricbus could not carry, by method name
        self.unsupported: dict[str, int] = {}

    # -- the run ------------------------------------------------------------------------

    @property
    def run(self) -> Run:
        """The metricbus run behind this writer (started at the first call)."""
        if self._run is None:
            self._run = Run(self._project, name=self._name, config=self._config, **self._options)
            where = Path(self._run.settings.data_dir) / "tensorboard"
            print(
                f"metricbus SummaryWriter: nothing is written under {self.log_dir}: its last part names "
                f"the run, whose TensorBoard files the stack's TensorBoard sink writes under "
                f"{where / self._project} (`tensorboard --logdir {where}`)",
                file=sys.stderr,
                flush=True,
            )
        return self._run

    def _walltime(self, walltime: float | None) -> None:
        if walltime is not None and "walltime" not in self._said:
            self._said.add("walltime")
            log.warning("metricbus SummaryWriter: walltime= is not carried; events keep the time of the call")

    # -- what it carries ----------------------------------------------------------------

    def add_scalar(
        self,
        tag: str,
        scalar_value: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        new_style: bool = False,
        double_precision: bool = False,
    ) -> None:
        self._walltime(walltime)
        try:
            value = _float(scalar_value)
        except (TypeError, ValueError) as exc:
            self._skip("add_scalar", f"{tag!r}: {exc}")
            return
        self.run.log({tag: value}, step=global_step)

    def add_scalars(
        self,
        main_tag: str,
        tag_scalar_dict: Mapping[str, Any],
        global_step: int | None = None,
        walltime: float | None = None,
    ) -> None:
        self._walltime(walltime)
        try:
            data = {f"{main_tag}/{k}": _float(v) for k, v in tag_scalar_dict.items()}
        except (TypeError, ValueError, AttributeError) as exc:
            self._skip("add_scalars", f"{main_tag!r}: {exc}")
            return
        self.run.log(data, step=global_step)

    def add_histogram(
        self,
        tag: str,
        values: Any,
        global_step: int | None = None,
        bins: Any = "tensorflow",
        walltime: float | None = None,
        max_bins: int | None = None,
    ) -> None:
        self._walltime(walltime)
        count = bins if isinstance(bins, int) else (max_bins or 64)
        self.run.log_histogram(tag, values, bins=count, step=global_step)

    def add_text(
        self, tag: str, text_string: str, global_step: int | None = None, walltime: float | None = None
    ) -> None:
        self._walltime(walltime)
        self.run.log_table(tag, ["text"], [[str(text_string)]], step=global_step)

    def add_hparams(
        self,
        hparam_dict: Mapping[str, Any],
        metric_dict: Mapping[str, Any],
        hparam_domain_discrete: Any = None,
        run_name: str | None = None,
        global_step: int | None = None,
    ) -> None:
        """Hyperparameters become the run's config (at its start, or an update); metrics are logged."""
        if self._run is None:
            self._config.update(hparam_dict)
        else:
            self._run.config.update(hparam_dict)
        try:
            metrics = {k: _float(v) for k, v in metric_dict.items()}
        except (TypeError, ValueError, AttributeError) as exc:
            self._skip("add_hparams", str(exc))
            return
        if metrics:
            self.run.log(metrics, step=global_step)

    def flush(self) -> None:
        """Publish what was logged (waits up to 10 s; the rest stays in the spool)."""
        if self._run is not None:
            self._run.flush(10.0)

    def close(self) -> None:
        """Finish the run (idempotent)."""
        if self._run is not None:
            self._run.finish()

    def get_logdir(self) -> str | None:
        return self.log_dir

    def __enter__(self) -> SummaryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what it does not carry ---------------------------------------------------------

    def _skip(self, what: str, why: str) -> None:
        self.unsupported[what] = self.unsupported.get(what, 0) + 1
        if what not in self._said:
            self._said.add(what)
            log.warning(
                "metricbus SummaryWriter.%s: %s; skipped (said once, counted in writer.unsupported)",
                what,
                why,
            )

    def __getattr__(self, name: str) -> Any:
        if name in UNSUPPORTED:

            def unsupported(*args: Any, **kwargs: Any) -> None:
                self._skip(name, "metricbus does not carry this kind yet")

            return unsupported
        raise AttributeError(name)
