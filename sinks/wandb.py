"""The Weights & Biases sink: one W&B run per metricbus run, with its id, so it can resume.

Step mapping: W&B drops a ``step=`` that goes backwards, so history rows are logged without
``step=`` (W&B's own ``_step`` just counts rows) and carry ``metricbus/step`` (and
``metricbus/epoch``); every metric is defined with ``step_metric="metricbus/step"``, so
charts use the training step and a non-monotonic step never loses data.

Online when ``WANDB_API_KEY`` is set, offline (a local run directory, ``wandb sync``-able)
otherwise. ``include`` / ``exclude`` are globs over metric names. The sink runs in its own
process and consumer group, so a slow or unreachable W&B never stalls another sink or the
pipeline. Per-sample arrays and Histogram events become ``wandb.Histogram``; Table events
``wandb.Table``; RunFinished's summary and the run status go to the run summary and exit code.

Durability: W&B writes asynchronously and offers no flush; ``flush`` records which
(producer_id, seq) were handed to W&B beside the run, so a restart does not log them twice.
What W&B had not written when the process died is lost to this sink (replay restores it).
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from schemas import (
    DERIVED_PRODUCER,
    HISTOGRAM,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    TABLE,
    Event,
    Interval,
    SeqSet,
    check_run_id,
)

log = logging.getLogger("metricbus.sink.wandb")
SEQS_DIR = ".metricbus-seqs"
STEP = "metricbus/step"
EPOCH = "metricbus/epoch"


class WandbSink:
    """The ``wandb`` sink (see the module docstring for its guarantees)."""

    name = "wandb"

    def __init__(
        self,
        root: Path,
        include: Sequence[str] = ("*",),
        exclude: Sequence[str] = (),
        mode: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.include = tuple(include)
        self.exclude = tuple(exclude)
        self.mode = mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")
        self._runs: dict[str, Any] = {}
        self._seqs: dict[str, dict[str, SeqSet]] = {}
        self._pending = 0
        self._keep: dict[str, bool] = {}

    def open(self) -> None:
        """Create the root directory and import wandb (fails with the pip line if missing)."""
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / SEQS_DIR).mkdir(exist_ok=True)
        import wandb  # noqa: F401

    def recover(self, run_id: str) -> Mapping[str, Sequence[Interval]]:
        """Seqs already handed to W&B for the run."""
        path = self.root / SEQS_DIR / f"{check_run_id(run_id)}.json"
        if not path.exists():
            return {}
        return {p: [(a, b) for a, b in iv] for p, iv in json.loads(path.read_text()).items()}

    def write(self, events: Sequence[Event]) -> None:
        """Log events to their W&B runs (W&B queues them to its own service process)."""
        import numpy as np
        import wandb

        for e in events:
            run = self._run(e)
            if e.producer_id != DERIVED_PRODUCER:  # derived series carry no seq to track
                self._seqs.setdefault(e.run_id, {}).setdefault(e.producer_id, SeqSet()).add(e.seq)
            body = e.body
            if e.kind == METRICS:
                row: dict[str, Any] = {k: v for k, v in body["scalars"].items() if self._wanted(k)}
                for k, values in body["samples"].items():
                    if values and self._wanted(k):
                        row[k] = wandb.Histogram(np.asarray(values, dtype=float))  # type: ignore[arg-type]
                if row:
                    row[STEP] = body["step"]
                    if body["epoch"] is not None:
                        row[EPOCH] = body["epoch"]
                    run.log(row)
            elif e.kind == HISTOGRAM and self._wanted(body["name"]):
                hist = wandb.Histogram(np_histogram=(body["counts"], body["edges"]))
                run.log({body["name"]: hist, STEP: body["step"]})
            elif e.kind == TABLE and self._wanted(body["name"]):
                run.log(
                    {
                        body["name"]: wandb.Table(columns=body["columns"], data=body["rows"]),
                        STEP: body["step"],
                    }
                )
            elif e.kind == RUN_FINISHED:
                run.summary.update({k: v for k, v in body["summary"].items() if self._wanted(k)})
                run.summary["metricbus/status"] = body["status"]
                run.finish(exit_code=0 if body["status"] == "finished" else 1)
                del self._runs[e.run_id]
            self._pending += 1

    def pending(self) -> int:
        """Events handed to W&B since the last flush."""
        return self._pending

    def flush(self) -> None:
        """Record which seqs were handed to W&B (W&B itself has no flush)."""
        for run_id, seqs in self._seqs.items():
            path = self.root / SEQS_DIR / f"{run_id}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({p: s.intervals() for p, s in seqs.items()}))
            os.replace(tmp, path)
        self._pending = 0

    def close(self) -> None:
        """Finish the runs still open (their W&B status stays running until RunFinished)."""
        for run in self._runs.values():
            run.finish(exit_code=0)
        self._runs.clear()

    # -- internals ------------------------------------------------------------------------

    def _wanted(self, name: str) -> bool:
        keep = self._keep.get(name)
        if keep is None:
            keep = self._keep[name] = any(fnmatch.fnmatchcase(name, g) for g in self.include) and not any(
                fnmatch.fnmatchcase(name, g) for g in self.exclude
            )
        return keep

    def _run(self, e: Event) -> Any:
        run = self._runs.get(e.run_id)
        if run is not None:
            return run
        import wandb

        if e.kind == RUN_STARTED:
            project, name, config = (
                e.body["project"],
                e.body["name"],
                json.loads(e.body["config_json"] or "{}"),
            )
            tags = list(e.body["tags"])
        else:
            project, name, config, tags = "_unknown", e.run_id, {}, []
        run = wandb.init(
            project=project,
            name=name,
            id=e.run_id,
            config=config,
            tags=tags,
            dir=str(self.root),
            mode=self.mode,  # type: ignore[arg-type]
            resume="allow",
            reinit="create_new",
            settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        )
        run.define_metric(STEP)
        run.define_metric(EPOCH, step_metric=STEP)
        run.define_metric("*", step_metric=STEP)
        self._runs[e.run_id] = run
        return run
