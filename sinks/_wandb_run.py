"""The one home of W&B set-up: how a run is opened, how names become W&B names, alert levels.

The W&B sink (``sinks.wandb``) and the W&B alert consumer (``sinks.alerts.WandbAlerts``) both
open runs here, so a run is opened alike by both (same directory, mode, resume rules).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from metricbus.schemas import atomic_write, check_run_id, format_alert

#: each run's RunStarted (project, name, config, tags) as the W&B sink saw it, per run id
RUNS_DIR = ".metricbus-runs"
#: how each run ended, as far as the W&B sink knows (``keep_ending``), per run id
ENDINGS_DIR = ".metricbus-endings"
STEP = "metricbus/step"
EPOCH = "metricbus/epoch"
#: the history key holding each row's event identity, ``<producer_id>/<seq>``
ID_KEY = "_metricbus_id"
#: what W&B refuses in a project name (UsageError), and its length limit
_NOT_IN_PROJECT = re.compile(r"[/\\#?%:\x00-\x1f\x7f]")
_PROJECT_MAX = 128
#: W&B's length limit of a tag
_TAG_MAX = 64
#: keys W&B or this sink gives a meaning (see wandb_key)
_RESERVED = frozenset({"", "_step", "_runtime", "_timestamp", "_wandb", STEP, EPOCH, ID_KEY})


def wandb_project(project: str) -> str:
    """A project name W&B accepts, as close to the metricbus one as it allows.

    W&B refuses slashes, backslashes, ``# ? % :`` and names over 128 characters: those become ``-``
    and a long name keeps its start plus a hash of the whole (the original is in the run's
    config as ``metricbus/project``).
    """
    return _cut(_NOT_IN_PROJECT.sub("-", project), project, _PROJECT_MAX)


def _cut(clean: str, original: str, limit: int) -> str:
    """``clean``, or past ``limit`` characters its start plus ``~`` and a hash of ``original``."""
    if len(clean) <= limit:
        return clean
    digest = hashlib.sha256(original.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    return clean[: limit - 17] + "~" + digest


def wandb_key(name: str) -> str:
    """The W&B key of a metric name: the name, unless W&B or this sink gives that key a meaning.

    W&B drops a logged ``_step`` and ``_runtime`` and takes ``_timestamp`` as the row's time,
    an empty name is dropped, and ``metricbus/step``, ``metricbus/epoch`` and ``_metricbus_id``
    are this sink's: such a name gets ``~`` and 6 hex digits of its hash (as the TensorBoard
    sink maps its unsafe names), so its values are kept under a key of their own.
    """
    if name not in _RESERVED:
        return name
    return f"{name}~{hashlib.sha1(name.encode()).hexdigest()[:6]}"  # noqa: S324 - a name, not a secret


def wandb_tags(tags: Sequence[str]) -> list[str]:
    """Tags W&B accepts: 1 to 64 characters each (it refused to open a run with any other).

    An empty tag is left out; a longer one keeps its start plus a hash of the whole (the
    originals are in the run's config as ``metricbus/tags``); duplicates once.
    """
    out: list[str] = []
    for tag in tags:
        tag = _cut(tag, tag, _TAG_MAX)
        if tag and tag not in out:
            out.append(tag)
    return out


def run_project(root: Path, run_id: str) -> str | None:
    """The W&B project the sink writing under ``root`` opens ``run_id`` in; None before its RunStarted."""
    try:
        meta = json.loads((Path(root) / RUNS_DIR / f"{check_run_id(run_id)}.json").read_text())
    except FileNotFoundError:
        return None
    return wandb_project(meta["project"])


def kept_ending(root: Path, run_id: str) -> dict[str, Any]:
    """How ``run_id`` ended, as kept by ``keep_ending``: ``exit_code``, ``complete``; {} if not."""
    try:
        kept = json.loads(_ending_path(root, run_id).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    return kept if isinstance(kept, dict) else {}


def keep_ending(root: Path, run_id: str, **ending: Any) -> None:
    """Keep how ``run_id`` ended, durably (OSError while the disk refuses).

    ``exit_code``: its RunFinished's; ``complete``: its derived series are all in; ``None``
    forgets one (a new attempt begins).

    The next owner of the run after a rebalance or a restart is not handed that RunFinished
    again (it is held already); opening the run again for a late point, it reads this instead.
    """
    kept = kept_ending(root, run_id)
    if all(kept.get(k) == v for k, v in ending.items()):
        return
    kept = {k: v for k, v in {**kept, **ending}.items() if v is not None}
    atomic_write(_ending_path(root, run_id), json.dumps(kept).encode())


def _ending_path(root: Path, run_id: str) -> Path:
    return Path(root) / ENDINGS_DIR / f"{check_run_id(run_id)}.json"


def wandb_mode(mode: str | None) -> str:
    """``mode``, else online when ``WANDB_API_KEY`` is set, else offline (a ``wandb sync``-able directory)."""
    return mode or ("online" if os.environ.get("WANDB_API_KEY") else "offline")


def init_run(root: Path, run_id: str, mode: str, project: str | None, **fields: Any) -> Any:
    """Open (or resume) W&B run ``run_id`` under ``root``; ``fields``: name, config, tags.

    Blocks while wandb-core starts (seconds for the first run of a process). Raises what
    ``wandb.init`` raises; a missing wandb is an ImportError naming the extra.
    """
    try:
        import wandb
    except ImportError as exc:
        raise ImportError("the W&B sink needs wandb: pip install 'metricbus[wandb]'") from exc

    Path(root).mkdir(parents=True, exist_ok=True)
    return wandb.init(
        id=run_id,
        project=project,
        dir=str(root),
        mode=mode,  # type: ignore[arg-type]
        resume="allow",
        reinit="create_new",
        settings=wandb.Settings(console="off", x_disable_stats=True, silent=True),
        **fields,
    )


#: an alert's severity as a W&B alert level (a resolved one is INFO)
WANDB_LEVELS = {"critical": "ERROR", "warning": "WARN", "info": "INFO"}


def raise_on_wandb(run: Any, alert: Mapping[str, Any]) -> None:
    """``run.alert`` of an alert: its rule as the title, its console line as the text."""
    import wandb

    firing = alert["state"] == "firing"
    level = WANDB_LEVELS.get(alert["severity"], "WARN") if firing else "INFO"
    closed = "ended" if alert["state"] == "ended" else "resolved"  # a finished run's alerts end
    title = alert["rule"] if firing else f"{alert['rule']} {closed}"
    run.alert(title=title, text=format_alert(alert), level=getattr(wandb.AlertLevel, level))  # type: ignore[attr-defined]
