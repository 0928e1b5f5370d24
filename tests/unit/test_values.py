import logging
import math

import numpy as np
import pytest
import torch

from metricbus.producers import ValueGate
from metricbus.schemas import MetricValueError


def test_numbers_numpy_and_torch_become_floats_and_arrays_become_samples():
    gate = ValueGate()
    scalars, samples = gate.split(
        {
            "f": 0.5,
            "i": 3,
            "b": True,
            "np": np.float32(1.5),
            "np0d": np.array(2.0),
            "t0d": torch.tensor(4.0),
            "arr": np.array([[1, 2], [3, 4]]),
            "list": [1, 2.5],
            "t1d": torch.tensor([1.0, 2.0], requires_grad=True),
        }
    )
    assert scalars == {"f": 0.5, "i": 3.0, "b": 1.0, "np": 1.5, "np0d": 2.0, "t0d": 4.0}
    assert samples == {"arr": [1.0, 2.0, 3.0, 4.0], "list": [1.0, 2.5], "t1d": [1.0, 2.0]}
    assert all(type(v) is float for v in scalars.values())
    assert gate.dropped == 0


def test_nan_and_inf_are_kept():
    scalars, _ = ValueGate().split(
        {"loss": float("nan"), "kl": float("inf"), "t": torch.tensor(float("nan"))}
    )
    assert math.isnan(scalars["loss"]) and scalars["kl"] == math.inf and math.isnan(scalars["t"])


def test_bad_values_are_dropped_counted_and_warned_once_per_name(caplog):
    gate = ValueGate()
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"):
        for _ in range(3):
            scalars, _ = gate.split({"ok": 1.0, "text": "high", "obj": object(), 5: 1.0})
            assert scalars == {"ok": 1.0}
    assert gate.dropped == 9
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 3  # one per bad name, not one per call
    assert any("'text'" in w and "str" in w for w in warnings)


def test_oversize_arrays_are_refused_with_the_limit_in_the_message(caplog):
    gate = ValueGate(max_samples=10)
    with caplog.at_level(logging.WARNING):
        _, samples = gate.split({"big": list(range(11)), "small": list(range(10))})
    assert list(samples) == ["small"]
    assert "over the limit of 10" in caplog.text


def test_strict_raises_with_the_metric_name():
    with pytest.raises(MetricValueError, match="'text'"):
        ValueGate(strict=True).split({"text": "high"})


def test_a_huge_array_is_refused_by_its_size_without_being_converted(caplog):
    """Issue 13 point 9: np.zeros(1_000_000) spent ~2 s in tolist() before being refused."""

    class NoConvert(np.ndarray):
        def tolist(self):
            raise AssertionError("converted before its size was checked")

    gate = ValueGate()
    scalars, samples = gate.split({"big": np.zeros(1_000_000).view(NoConvert)})
    assert (scalars, samples, gate.dropped) == ({}, {}, 1)
    assert "1000000 samples is over the limit" in caplog.text


def test_a_list_that_contains_itself_is_refused_instead_of_looping_forever():
    loop = [1.0, 2.0]
    loop.append(loop)
    gate = ValueGate()
    assert gate.split({"loop": loop}) == ({}, {}) and gate.dropped == 1


def test_a_value_whose_float_raises_anything_is_dropped_with_one_warning(caplog):
    class Weird:
        def __float__(self):
            raise RuntimeError("device lost")

    gate = ValueGate()
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"):
        for _ in range(100):
            gate.split({"w": Weird(), "ok": 1.0})
    assert gate.dropped == 100
    warnings = [r for r in caplog.records if "metric 'w'" in r.getMessage()]
    assert len(warnings) == 1 and "RuntimeError: device lost" in warnings[0].getMessage()
    assert not any(r.exc_info for r in caplog.records)  # a line, not a traceback


def test_split_owned_keeps_a_checked_dict_and_sends_anything_else_the_careful_way(caplog):
    """The publisher's check of log()'s plain dicts: names seen all-str and a float sum pass as
    they are; a new name set, a non-str name or an int too large for a float go through split()."""
    gate = ValueGate()
    values = {"Train/Loss": 0.5, "step_count": 3, "done": True}
    first = gate.split_owned(values)  # a name set not seen before: checked and copied
    assert first == {"Train/Loss": 0.5, "step_count": 3.0, "done": 1.0} and first is not values
    assert gate.split_owned(values) is values  # seen: kept as it is (ints are written as doubles)
    assert gate.all_plain([values, {"Train/Loss": 1.0, "step_count": 4, "done": False}])
    assert not gate.all_plain([{"Train/Loss": 1, "step_count": 4, "done": False}])  # an int sum
    assert not gate.all_plain([{"new": 1.0}])
    # plain_columns: each dict's names (one tuple, checked once, for a batch of one set of
    # names) or several seen, and every value in order
    names, flat = gate.plain_columns([values, values])
    assert names == [tuple(values)] * 2 and names[0] is names[1] and flat == [0.5, 3, True] * 2
    gate.split_owned({"other": 1.0})
    assert gate.plain_columns([values, {"other": 2.0}]) == ([tuple(values), ("other",)], [0.5, 3, True, 2.0])
    assert gate.plain_columns([values, {"other": 2.0}, {"new": 1.0}]) is None
    assert gate.plain_columns([{"Train/Loss": 0.5, "done": True, "step_count": 3}]) is None  # another order
    # same length, same names, other order in one dict: not the one-set batch
    swapped = {"Train/Loss": 0.5, "done": True, "step_count": 3}
    gate.split_owned(swapped)
    assert gate.plain_columns([values, swapped])[0] == [tuple(values), tuple(swapped)]
    assert gate.all_plain([{"Train/Loss": 1, "step_count": 4, "done": False}, values])  # ints beside a float

    class Hostile(str):
        __hash__ = str.__hash__

        def __eq__(self, other):
            raise RuntimeError("no")

    assert gate.plain_columns([values, {Hostile("Train/Loss"): 1.0, "step_count": 2, "done": 1}]) is None
    with caplog.at_level(logging.WARNING, logger="metricbus.producer"):
        assert not gate.all_plain([{"big": 10**400, "ok": 1.0}])  # sum raises: no exception out
        assert gate.split_owned({"big": 10**400, "ok": 1.0}) == {"ok": 1.0}
        assert gate.split_owned({1: 2.0, "ok": 1.0}) == {"ok": 1.0}
    assert gate.dropped == 2 and "'big'" in caplog.text
