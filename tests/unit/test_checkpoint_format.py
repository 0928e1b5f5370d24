"""A golden checkpoint of the current format, kept in the tests.

The stream worker's checkpoint is a pickle of its own objects (``stream_jobs/_checkpoint.py``):
a class that changes shape silently changes the format. These tests fail on such a change, so a
new format is a deliberate step: bump ``FORMAT`` (older checkpoints are then refused and their
partitions rebuilt from the topic, or migrated), then regenerate the golden file with
``python -m tests.unit.test_checkpoint_format``.
"""

from __future__ import annotations

import collections
import math
import pickle
import random
from pathlib import Path
from typing import Any

import pytest

from metricbus.stream_jobs import StreamProcessor
from metricbus.stream_jobs._checkpoint import FORMAT, load, snapshot
from metricbus.stream_jobs._rules import parse_rules

from .test_checkpoint import outputs
from .test_columns import run_events

GOLDEN = Path(__file__).resolve().parents[1] / "data" / f"stream-checkpoint-format-{FORMAT}.pickle"
OFFSET = 40
#: every kind of rule, with the options that keep state: frozen here, so that a change to the
#: default pack (rules are configuration, not checkpointed) does not read as a format change
RULES = """
rules:
  - {name: nan_loss, kind: nonfinite, metric: "*[Ll]oss*"}
  - {name: stalled, kind: absent, seconds: 300}
  - {name: below_target, kind: threshold, metric: Epoch/AvgReward, op: "<", value: 0.7, warmup: 3,
     only_if: {metric: "@reward", within: [0, 1]}}
  - {name: slow, kind: threshold, metric: Performance/Generation_TokensPerSec, op: "<", value: 190, for: 3}
  - {name: collapse, kind: zscore, metric: "@reward", window: 20, z: 2.0, direction: below}
  - {name: shift, kind: shift, metric: "@reward", direction: below, block: 5, reference: 8}
  - {name: frozen, kind: frozen, metric: "@loss", window: 50, warmup: 20}
  - {name: target, kind: threshold, metric: Epoch/AvgReward, op: "<", value: 0.7, patience_steps: 50}
  - {name: jump, kind: rate, metric: Epoch/APITokens, max_change: 400}
"""


def checkpointed() -> tuple[StreamProcessor, list[Any]]:
    """A processor after the first 500 events of a deterministic run (NaN loss and alerts included)."""
    events = run_events(random.Random(11), n=900)
    processor = StreamProcessor(rules=parse_rules(RULES))
    outputs(processor, events[:500])
    return processor, events


def shape(obj: Any) -> Any:
    """What a pickled object holds, comparable across processes (sets sorted, NaN equal to NaN)."""
    if isinstance(obj, float):
        return "nan" if math.isnan(obj) else obj
    if isinstance(obj, (str, int, bytes, bool, type(None))):
        return obj
    if isinstance(obj, dict):
        return {"dict": sorted(((repr(shape(k)), shape(v)) for k, v in obj.items()), key=lambda kv: kv[0])}
    if isinstance(obj, (set, frozenset)):
        return {"set": sorted(repr(shape(x)) for x in obj)}
    if isinstance(obj, (list, tuple, collections.deque)):
        return [type(obj).__name__, [shape(x) for x in obj]]
    state = obj.__getstate__() if hasattr(obj, "__getstate__") else obj.__dict__
    if isinstance(state, tuple):  # (dict, slots) of a slotted class
        merged: dict[str, Any] = {}
        for part in state:
            merged.update(part or {})
        state = merged
    return {f"{type(obj).__module__}.{type(obj).__qualname__}": shape(state)}


def test_the_golden_checkpoint_loads_and_the_restored_worker_goes_on_as_one_that_never_stopped(tmp_path):
    assert GOLDEN.exists(), (
        f"no golden checkpoint of format {FORMAT}: run `python -m tests.unit.test_checkpoint_format`"
    )
    uninterrupted, events = checkpointed()
    expected = outputs(uninterrupted, events[500:])
    restored = StreamProcessor(rules=parse_rules(RULES))
    assert load(GOLDEN, restored) == OFFSET
    got = outputs(restored, events[500:])
    assert got[1] == expected[1]
    assert got[0].keys() == expected[0].keys()
    assert got[0] == pytest.approx(expected[0], nan_ok=True)


def test_todays_checkpoint_has_the_shape_of_the_golden_one():
    golden = pickle.loads(GOLDEN.read_bytes())  # noqa: S301 - the project's own test file
    today = pickle.loads(snapshot(checkpointed()[0], 3, OFFSET))  # noqa: S301
    assert golden["format"] == today["format"] == FORMAT
    assert shape(today) == shape(golden), (
        "the checkpoint's shape changed: bump FORMAT in stream_jobs/_checkpoint.py (a new format, "
        "refused or migrated from the old one) and run `python -m tests.unit.test_checkpoint_format`"
    )


if __name__ == "__main__":
    GOLDEN.parent.mkdir(parents=True, exist_ok=True)
    GOLDEN.write_bytes(snapshot(checkpointed()[0], 3, OFFSET))
    print(f"wrote {GOLDEN}")
