"""What a call into a run may not do: raise into the training loop, or act once it finished.

A call metricbus cannot carry out (a value it cannot encode, a media item of the wrong shape, a
fault of its own) is skipped: said once per call and kind of error, with the traceback the
first time, and counted in ``run.stats()["skipped_calls"]``. Only ``strict=True`` raises, and
only metricbus's own errors (a value that is not a number, say). A call after ``finish()`` is
ignored, with a warning.
"""

from __future__ import annotations

import logging

from metricbus.schemas import MetricbusError

log = logging.getLogger("metricbus.producer")


class CallGuard:
    """One run's: the calls it skipped (``count``), which kinds it said, whether it ``finished``."""

    def __init__(self, run_id: str, strict: bool = False) -> None:
        self.run_id, self.strict = run_id, strict
        self.finished = False  #: set by ``finish()``: later calls are ignored
        self.count = 0
        self._said: set[tuple[str, str]] = set()

    def ignored(self, what: str) -> bool:
        """Whether the run finished, so the call ``what`` is ignored (said)."""
        if self.finished:
            log.warning("run %s is finished; %s() is ignored", self.run_id, what)
        return self.finished

    def skipped(self, what: str, exc: BaseException) -> None:
        """The call ``what`` failed with ``exc`` and was skipped (raised again under strict)."""
        if self.strict and isinstance(exc, MetricbusError):
            raise exc
        if self._first(what, exc):
            log.error(
                "metricbus %s() failed and the call was skipped: %s (said once; later ones are "
                "counted in run.stats()['skipped_calls'])",
                what,
                exc,
                exc_info=True,
            )

    def item_failed(self, what: str, exc: BaseException) -> None:
        """An item a background thread could not take (a wrong shape, an unreadable file)."""
        if self._first(what, exc):
            log.error(
                "metricbus %s() skipped an item: %s (said once; later ones are counted in "
                "run.stats()['skipped_calls'])",
                what,
                exc,
            )

    def _first(self, what: str, exc: BaseException) -> bool:
        """Count it; whether it is the first of its call and kind."""
        self.count += 1
        key = (what, type(exc).__name__)
        if key in self._said:
            return False
        self._said.add(key)
        return True
