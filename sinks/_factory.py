"""Make a sink by name (the CLI's `sink` and `replay --to`), like SB3's make_output_format."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from metricbus.schemas import MediaStore, MetricbusError

from ._protocol import Sink

#: Sink name -> the module it needs beyond the core, and the extra that brings it.
EXTRAS = {"tensorboard": "tensorboard", "wandb": "wandb"}
KINDS = ("parquet", "tensorboard", "wandb")


def make_sink(
    kind: str,
    out: Path,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    layout: Path | None = None,
    media: MediaStore | None = None,
) -> Sink:
    """A sink writing under ``out``; a missing extra fails with its pip line.

    ``include`` / ``exclude``: globs over metric names, for the tensorboard and wandb sinks;
    the archive refuses them (it is the record every replay and report reads: it keeps every
    event). ``layout``: tensorboard only, a YAML file of the user's custom-scalars charts.
    ``media``: the store the tensorboard and wandb sinks read logged media from (the archive
    keeps Media events as rows with their reference; the bytes stay in the store).
    """
    module = EXTRAS.get(kind)
    if module is not None:
        try:
            __import__(module)
        except ImportError:
            raise MetricbusError(
                f"the {kind} sink needs {module}: pip install 'metricbus[{module}]'"
            ) from None
    if layout is not None and kind != "tensorboard":
        raise MetricbusError(
            f"--layout is the tensorboard sink's (custom-scalars charts), not the {kind} sink's"
        )
    if kind == "parquet":
        from .parquet import ParquetArchive

        if include or exclude:
            raise MetricbusError(
                "the parquet sink keeps every event (it is the archive that replay, reports and "
                "health read): --include/--exclude are for the tensorboard and wandb sinks"
            )
        return ParquetArchive(out)
    if kind == "tensorboard":
        from ._tb_layout import load_layout
        from .tensorboard import TensorBoardSink

        return TensorBoardSink(
            out,
            layout=load_layout(layout) if layout is not None else None,
            include=tuple(include) or ("*",),
            exclude=tuple(exclude),
            media=media,
        )
    if kind == "wandb":
        from .wandb import WandbSink

        return WandbSink(out, include=tuple(include) or ("*",), exclude=tuple(exclude), media=media)
    raise MetricbusError(f"no sink named {kind!r}; choose one of {', '.join(KINDS)}")
