"""A wandb-style API over metricbus: switch a script with one import line.

    import metricbus.wandb as wandb          # was: import wandb
    wandb.init(project="ppo", config={"lr": 3e-4})
    wandb.log({"loss": 0.5})                 # step: wandb's own counting, or step=
    wandb.log({"reward": 1.0}, commit=False) # accumulates into the current step
    wandb.summary["best"] = 0.9
    wandb.finish()

Steps follow wandb's rules: each committed ``log`` is one step; ``step=`` sets it (a lower one
than the current is refused once, as wandb does); ``commit=False`` accumulates keys into the
current step until a committed ``log`` or a higher ``step``. ``Histogram`` and ``Table`` become
metricbus histograms and tables; ``Image``, ``Video``, ``Audio`` and ``Html`` (kept as text)
metricbus media, a list of them one item each under ``<key>/<i>``. ``config`` changes after
``init`` are config updates of the run (every sink merges them into its config). What metricbus
does not carry (artifacts, ``watch``, ``alert``) is said once per kind and counted in
``run.unsupported``. Nothing raises into the training loop.
"""

from __future__ import annotations

import logging
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ._run import Run

log = logging.getLogger("metricbus")


class Histogram:
    """``wandb.Histogram(sequence)`` or ``wandb.Histogram(np_histogram=(counts, edges))``."""

    def __init__(self, sequence: Any = None, np_histogram: Any = None, num_bins: int = 64) -> None:
        self.sequence = sequence
        self.np_histogram = np_histogram
        self.num_bins = num_bins


class Table:
    """``wandb.Table(columns=[...], data=[[...], ...])`` (``add_data`` appends a row)."""

    def __init__(
        self, columns: Sequence[str] | None = None, data: Iterable[Sequence[Any]] | None = None
    ) -> None:
        self.columns = [str(c) for c in (columns or [])]
        self.data = [list(r) for r in (data or [])]

    def add_data(self, *row: Any) -> None:
        self.data.append(list(row))


class _Media:
    """What ``wandb.Image`` / ``Video`` / ``Audio`` / ``Html`` hold until ``log`` hands it to the run."""

    kind = "image"

    def __init__(self, data_or_path: Any, caption: str | None = None, **kwargs: Any) -> None:
        self.data = data_or_path
        self.caption = caption
        self.options = kwargs


class Image(_Media):
    """``wandb.Image(array | PIL image | figure | path, caption=...)``."""


class Video(_Media):
    """``wandb.Video(frames TxCxHxW | path to a GIF, fps=4, caption=...)``."""

    kind = "video"


class Audio(_Media):
    """``wandb.Audio(samples | path to a WAV, sample_rate=..., caption=...)``."""

    kind = "audio"


class Html(_Media):
    """``wandb.Html(source)``: kept as text (its source shown, never run)."""

    kind = "text"


class Config(dict):  # type: ignore[type-arg]
    """``run.config``: a dict with attribute access and ``update``; changes after init are recorded."""

    def __init__(self, owner: WandbRun, initial: Mapping[str, Any]) -> None:
        super().__init__(initial)
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self[name] = value

    def __setitem__(self, key: str, value: Any) -> None:
        super().__setitem__(key, value)
        self._owner._config_changed({key: value})

    def update(self, d: Any = None, allow_val_change: bool | None = None, **kw: Any) -> None:  # type: ignore[override]
        changes = {**dict(d or {}), **kw}
        super().update(changes)
        self._owner._config_changed(changes)


class WandbRun:
    """What ``init`` returns: ``log``, ``config``, ``summary``, ``define_metric``, ``finish``."""

    def __init__(self, run: Run) -> None:
        self._run = run
        self.config = Config(self, {})
        self.summary: dict[str, Any] = {}
        self.step = 0  #: the current (uncommitted) step, as wandb's ``run.step``
        self._pending: dict[str, Any] = {}
        self._said: set[str] = set()
        self.unsupported: dict[str, int] = {}
        self._ready = True

    @property
    def id(self) -> str:
        return self._run.run_id

    @property
    def name(self) -> str | None:
        return self._run.name

    @property
    def project(self) -> str:
        return self._run.project

    @property
    def metricbus_run(self) -> Run:
        return self._run

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None) -> None:
        try:
            if step is not None:
                step = int(step)
                if step < self.step:
                    self._say(
                        "step",
                        f"step {step} is lower than the current step {self.step}: "
                        "the data is dropped, as wandb does",
                    )
                    return
                if step > self.step:
                    self._commit()
                    self.step = step
            for key, value in data.items():
                self._take(str(key), value)
            if commit is None:
                commit = step is None
            if commit:
                self._commit()
                self.step += 1
        except Exception as exc:  # noqa: BLE001 - never into the training loop
            self._say("log", f"log() failed and was skipped: {exc}")

    def _take(self, key: str, value: Any) -> None:
        if isinstance(value, Histogram):
            if value.np_histogram is not None:
                counts, edges = value.np_histogram
                self._run.log_histogram(key, edges=list(edges), counts=list(counts), step=self.step)
            else:
                self._run.log_histogram(key, value.sequence, bins=value.num_bins, step=self.step)
        elif isinstance(value, Table):
            self._run.log_table(key, value.columns, value.data, step=self.step)
        elif isinstance(value, _Media):
            self._media(key, value)
        elif isinstance(value, list | tuple) and value and all(isinstance(v, _Media) for v in value):
            for i, item in enumerate(value):  # W&B's gallery: an item each
                self._media(f"{key}/{i}", item)
        elif (
            isinstance(value, bool | numbers.Number)
            or hasattr(value, "item")
            or isinstance(value, list | tuple)
        ):
            self._pending[key] = value
        elif isinstance(value, Mapping):  # a nested dict: its keys become "<key>/<subkey>" series
            for k, v in value.items():
                self._take(f"{key}/{k}", v)
        else:
            kind = type(value).__name__
            self.unsupported[kind] = self.unsupported.get(kind, 0) + 1
            self._say(kind, f"{kind} values (key {key!r}) are not carried by metricbus yet; skipped")

    def _media(self, key: str, item: _Media) -> None:
        run, step, caption = self._run, self.step, item.caption
        if isinstance(item, Video):
            run.log_video(key, item.data, fps=item.options.get("fps") or 4, step=step, caption=caption)
        elif isinstance(item, Audio):
            rate = item.options.get("sample_rate") or 44100
            run.log_audio(key, item.data, rate=rate, step=step, caption=caption)
        elif isinstance(item, Html):
            data = item.data.read() if hasattr(item.data, "read") else item.data
            run.log_text(key, str(data), step=step, caption=caption)
        else:
            run.log_image(key, item.data, step=step, caption=caption)

    def _commit(self) -> None:
        if self._pending:
            data, self._pending = self._pending, {}
            self._run.log(data, step=self.step)
            for k, v in data.items():  # wandb's default summary: the last value of each key
                self.summary.setdefault(k, None)
                self.summary[k] = v

    def _config_changed(self, changes: Mapping[str, Any]) -> None:
        if getattr(self, "_ready", False) and changes:
            self._run.update_config(changes)

    def define_metric(self, name: str, step_metric: str | None = None, **kwargs: Any) -> None:
        self._say(
            "define_metric", "define_metric() is accepted; metricbus plots every series against its step"
        )

    def watch(self, *args: Any, **kwargs: Any) -> None:
        self.unsupported["watch"] = self.unsupported.get("watch", 0) + 1
        self._say("watch", "watch() is not carried yet: log gradient norms with run.log")

    def alert(self, title: str = "", text: str = "", level: Any = None, **kwargs: Any) -> None:
        self.unsupported["alert"] = self.unsupported.get("alert", 0) + 1
        self._say(
            "alert", "alert() is not carried: metricbus alerts come from rules (metricbus worker --rules)"
        )

    def log_artifact(self, *args: Any, **kwargs: Any) -> None:
        self.unsupported["artifact"] = self.unsupported.get("artifact", 0) + 1
        self._say("artifact", "artifacts are not carried by metricbus")

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        self._commit()
        scalars = {k: v for k, v in self.summary.items() if isinstance(v, numbers.Number)}
        self._run.finish(status="finished" if not exit_code else "failed", summary=scalars)

    def _say(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            log.warning("metricbus.wandb: %s (said once)", message)

    def __enter__(self) -> WandbRun:
        return self

    def __exit__(self, exc_type: Any, *rest: Any) -> None:
        self.finish(exit_code=1 if exc_type else 0)


def init(
    project: str | None = None,
    name: str | None = None,
    config: Mapping[str, Any] | None = None,
    tags: Iterable[str] | None = None,
    id: str | None = None,  # noqa: A002 - wandb's own keyword
    **kwargs: Any,
) -> WandbRun:
    """``wandb.init``: project, name, config, tags and id carry over; other keywords are ignored."""
    ignored = sorted(
        k for k in kwargs if k not in ("settings", "strict", "system_metrics", "rank", "world_size")
    )
    options = {k: v for k, v in kwargs.items() if k not in ignored}
    run = Run(
        project or "uncategorized",
        name=name,
        config=dict(config or {}),
        tags=tags or (),
        run_id=id,
        **options,
    )
    wrapped = WandbRun(run)
    wrapped._ready = False
    wrapped.config.update(dict(config or {}))
    wrapped._ready = True
    if ignored:
        log.info("metricbus.wandb.init: %s are wandb options metricbus does not use", ", ".join(ignored))
    return wrapped
