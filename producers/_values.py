"""Turning what users pass to log() into scalars and sample arrays, cheaply and without raising.

Accepts Python numbers and bools, numpy scalars and arrays, torch tensors (0-d -> scalar,
n-d -> samples), lists and tuples of numbers, all without importing numpy or torch.
NaN and inf are kept: they are signals (a diverged loss), not noise.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Any

from metricbus.schemas import MetricValueError

log = logging.getLogger("metricbus.producer")

#: Largest sample array accepted for one metric in one log() call.
MAX_SAMPLES = 65_536
#: Most labels on one log() call, and the longest key or value.
MAX_LABELS = 16
MAX_LABEL_LENGTH = 128
_NUMBER = (float, int, bool)
_BIG = 2**1023  # ints beyond this overflow float(): the careful path says so


class ValueGate:
    """Filters values into scalars and samples; counts and warns once per bad metric name."""

    def __init__(self, strict: bool = False, max_samples: int = MAX_SAMPLES) -> None:
        self.strict = strict
        self.max_samples = max_samples
        self.dropped = 0
        self._warned: set[str] = set()
        self._lock = threading.Lock()
        self._str_names: set[tuple[Any, ...]] = set()  # name tuples split() found all str

    def split(self, data: Mapping[Any, Any]) -> tuple[dict[str, float], dict[str, list[float]]]:
        """Return ``(scalars, samples)``; what cannot be encoded is dropped and counted."""
        for key, value in data.items():  # fast path: str -> float only, the common case
            if type(value) is not float or type(key) is not str:
                break
        else:
            return dict(data), {}
        scalars: dict[str, float] = {}
        samples: dict[str, list[float]] = {}
        for key, value in data.items():
            if type(key) is not str:
                self._reject(repr(key), value, "metric names must be str")
                continue
            kind = type(value)
            if kind is float:
                scalars[key] = value
            elif kind is bool or (kind is int and -_BIG < value < _BIG):
                scalars[key] = float(value)
            else:
                self._slow(key, value, scalars, samples)
        return scalars, samples

    def split_owned(self, data: dict[Any, Any]) -> dict[str, float]:
        """The scalars of a dict that is ours to keep (log()'s copy of plain numbers).

        ``data`` itself when :meth:`all_plain` says so of it; otherwise :meth:`split`'s.
        """
        if self.all_plain([data]):
            return data
        scalars = self.split(data)[0]
        if len(scalars) == len(data):
            if len(self._str_names) >= 4096:  # a run that makes up names as it goes: no cache
                self._str_names.clear()
            self._str_names.add(tuple(data))
        return scalars

    def all_plain(self, dicts: Sequence[dict[Any, Any]]) -> bool:
        """True when every dict's values are Python numbers and its names were all str before."""
        return self.plain_columns(dicts) is not None

    def plain_columns(
        self, dicts: Sequence[dict[Any, Any]]
    ) -> tuple[list[tuple[Any, ...]], list[Any]] | None:
        """Each dict's names and all their values in order; None when some dict needs :meth:`split_owned`.

        Each dict's names must have been found all str before. The values are checked by their
        sum being a float: each is then an int, float or bool (a list or a string makes ``sum``
        raise, a numpy number or a tensor makes the sum one), which the encoders write as
        doubles; an int too large for a float makes the sum raise, unless another cancels it
        first (then the encoder refuses the event and says so). The usual batch, every dict with
        one set of names in one order, returns one names tuple repeated, checked once (and the
        encoder then packs its name indices once, comparing by identity). C loops only.
        """
        if not dicts:
            return [], []
        values = list(chain.from_iterable(map(dict.values, dicts)))
        try:
            if type(sum(values)) is not float:
                return None
            first, n = tuple(dicts[0]), len(dicts)
            if len(values) == len(first) * n and list(chain.from_iterable(dicts)) == list(first) * n:
                return ([first] * n, values) if first in self._str_names else None
            names = list(map(tuple, dicts))
            return (names, values) if self._str_names.issuperset(names) else None
        except Exception:  # noqa: BLE001 - an int too large for a float, a name whose == raises: careful path
            return None

    def labels(self, labels: Mapping[Any, Any]) -> dict[str, str]:
        """``labels`` as Avro's map of strings: keys and values as ``str``, within the limits.

        At most :data:`MAX_LABELS` labels of :data:`MAX_LABEL_LENGTH` characters each; past
        that (or for a value that cannot be a string) the labels are dropped, counted and
        said once: the values are still logged.
        """
        try:
            if len(labels) > MAX_LABELS:
                raise ValueError(f"{len(labels)} labels, more than {MAX_LABELS}")
            out = {str(k): v if type(v) is str else str(v) for k, v in labels.items()}
            if any(len(k) > MAX_LABEL_LENGTH or len(v) > MAX_LABEL_LENGTH for k, v in out.items()):
                raise ValueError(f"a label longer than {MAX_LABEL_LENGTH} characters")
            return out
        except Exception as exc:  # noqa: BLE001 - whatever a user's object raises, log() must not
            self._reject("labels", labels, f"{type(exc).__name__}: {exc}")
            return {}

    def _slow(self, key: str, value: Any, scalars: dict[str, float], samples: dict[str, list[float]]) -> None:
        try:
            ndim = getattr(value, "ndim", None)
            if ndim == 0:  # numpy scalar or 0-d array / tensor
                scalars[key] = float(value.item())
                return
            if ndim is not None or isinstance(value, (list, tuple)):
                size = _size(value)  # before converting: a 1e6-element array is refused for free
                if size is not None and size > self.max_samples:
                    self._reject(key, value, f"{size} samples is over the limit of {self.max_samples}")
                    return
                flat = _flatten(value, self.max_samples)
                samples[key] = [float(v) for v in flat]
                return
            if isinstance(value, _NUMBER) or hasattr(value, "__float__"):
                scalars[key] = float(value)
                return
        except Exception as exc:  # noqa: BLE001 - whatever a user's object raises, log() must not
            self._reject(key, value, f"{type(exc).__name__}: {exc}")
            return
        self._reject(key, value, "not a number, an array of numbers or a 0-d tensor")

    def _reject(self, key: str, value: Any, why: str) -> None:
        message = (
            f"metric {key!r}: cannot log {type(value).__name__} value {_short(value)} ({why}); "
            "this value is dropped and counted"
        )
        if self.strict:
            raise MetricValueError(message + " (strict=True raises instead)")
        with self._lock:
            self.dropped += 1
            first = key not in self._warned
            self._warned.add(key)
        if first:
            log.warning("%s; further bad values of this metric are dropped silently", message)


def _size(value: Any) -> int | None:
    """Elements of an array or tensor without converting it (None for lists: walked with a limit)."""
    numel = getattr(value, "numel", None)  # torch
    if callable(numel):
        return int(numel())
    size = getattr(value, "size", None)  # numpy
    return size if isinstance(size, int) else None


def _flatten(value: Any, limit: int) -> list[Any]:
    """The leaves of nested lists / an array, in order.

    ValueError past ``limit`` leaves or ``4 * limit`` visited items (a list that contains
    itself would never end otherwise).
    """
    if hasattr(value, "detach"):  # torch tensor: no autograd, on the host
        value = value.detach().cpu()
    if hasattr(value, "tolist"):
        value = value.tolist()
    out: list[Any] = []
    stack = [value]
    visited = 0
    while stack:
        item = stack.pop()
        visited += 1
        if len(out) > limit or visited > 4 * limit + 16:
            raise ValueError(f"more than {limit} samples (or a list that contains itself)")
        if isinstance(item, (list, tuple)):
            stack.extend(reversed(item))
        else:
            out.append(item)
    if len(out) > limit:
        raise ValueError(f"{len(out)} samples is over the limit of {limit}")
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
