"""A drop-in for ``torch.utils.tensorboard.SummaryWriter``: switch a script with one import line.

    from metricbus.tensorboard import SummaryWriter   # was: from torch.utils.tensorboard import ...

Scalars, scalar groups, histograms, text and hparams become metricbus events, and images
(one, or a batch as TensorBoard's grid), figures, videos and audio metricbus media (the bytes
in the media store, the event by reference); the TensorBoard sink (and every other sink) shows
them. What metricbus does not carry yet (graphs, embeddings, PR curves, meshes, boxes) is said
once per kind and counted in ``writer.unsupported``, never silently dropped. ``walltime`` is
accepted; the event keeps the time of the call (said once when a caller passes one).

The run starts at the first call: project from ``project=`` or ``$METRICBUS_PROJECT``, else
the ``log_dir``'s parent (``logs/ppo/lr3e-4``: project ``ppo``, run ``lr3e-4``; torch's default
``runs/<date>_<host>``: project ``runs``), name from the ``log_dir``'s last part, so
TensorBoard's run directory names carry over; it says in one line where
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
    "add_image_with_boxes",
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
        parent = Path(log_dir).parent.name
        self._project = project or os.environ.get("METRICBUS_PROJECT") or parent or "tensorboard"
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

    def add_image(
        self,
        tag: str,
        img_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "CHW",
    ) -> None:
        """An image (TensorBoard's layouts: CHW by default, HWC, HW)."""
        self._walltime(walltime)
        try:
            image = _layout(img_tensor, dataformats, "HWC")
        except ValueError as exc:
            self._skip("add_image", f"{tag!r}: {exc}")
            return
        self.run.log_image(tag, image, step=global_step)

    def add_images(
        self,
        tag: str,
        img_tensor: Any,
        global_step: int | None = None,
        walltime: float | None = None,
        dataformats: str = "NCHW",
    ) -> None:
        """A batch of images, as one grid of up to 8 a row (as TensorBoard shows it)."""
        self._walltime(walltime)
        try:
            image = _grid(_layout(img_tensor, dataformats, "NHWC"))
        except ValueError as exc:
            self._skip("add_images", f"{tag!r}: {exc}")
            return
        self.run.log_image(tag, image, step=global_step)

    def add_figure(
        self,
        tag: str,
        figure: Any,
        global_step: int | None = None,
        close: bool = True,
        walltime: float | None = None,
    ) -> None:
        """A matplotlib figure (or a list of them, one image each under ``tag/<i>``), closed after."""
        self._walltime(walltime)
        figures = figure if isinstance(figure, list) else [figure]
        for i, fig in enumerate(figures):
            self.run.log_image(tag if len(figures) == 1 else f"{tag}/{i}", fig, step=global_step)
            if close:
                try:
                    import matplotlib.pyplot as plt

                    plt.close(fig)
                except Exception:  # noqa: BLE001, S110 - closing is a courtesy; never a fault here
                    pass

    def add_video(
        self,
        tag: str,
        vid_tensor: Any,
        global_step: int | None = None,
        fps: float = 4,
        walltime: float | None = None,
    ) -> None:
        """A batch of videos NxTxCxHxW (TensorBoard's layout), each frame the batch's grid."""
        self._walltime(walltime)
        try:
            videos = _layout(vid_tensor, "NTCHW", "NTHWC")
            frames = _np().stack([_grid(videos[:, t]) for t in range(videos.shape[1])])
        except ValueError as exc:
            self._skip("add_video", f"{tag!r}: {exc}")
            return
        self.run.log_video(tag, frames, fps=fps, step=global_step)

    def add_audio(
        self,
        tag: str,
        snd_tensor: Any,
        global_step: int | None = None,
        sample_rate: int = 44100,
        walltime: float | None = None,
    ) -> None:
        """A clip (1xL or L floats in [-1, 1], as TensorBoard takes it)."""
        self._walltime(walltime)
        self.run.log_audio(tag, snd_tensor, rate=sample_rate, step=global_step)

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


def _np() -> Any:
    import numpy as np

    return np


def _layout(data: Any, given: str, wanted: str) -> Any:
    """``data`` (an array or tensor laid out as ``given``, e.g. "CHW") as ``wanted`` (a view)."""
    np = _np()
    if hasattr(data, "detach"):
        data = data.detach().cpu().numpy()
    arr = np.asarray(data)
    given = given.upper()
    if arr.ndim != len(given) or sorted(set(given)) != sorted(given):
        raise ValueError(f"an array of shape {arr.shape} is not laid out as {given!r}")
    if "C" not in given:  # grey: a channel of one
        arr, given = arr[..., None], given + "C"
    if "N" in wanted and "N" not in given:
        arr, given = arr[None], "N" + given
    return arr.transpose([given.index(axis) for axis in wanted])


def _grid(batch: Any, per_row: int = 8) -> Any:
    """NxHxWxC images as one HxWxC image, ``per_row`` a row (TensorBoard's make_grid)."""
    np = _np()
    n, h, w, c = batch.shape
    if n == 1:
        return batch[0]
    cols = min(per_row, n)
    rows = -(-n // cols)
    grid = np.zeros((rows * h, cols * w, c), dtype=batch.dtype)
    for i in range(n):
        r, k = divmod(i, cols)
        grid[r * h : (r + 1) * h, k * w : (k + 1) * w] = batch[i]
    return grid
