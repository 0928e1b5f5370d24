"""Which logged series is a run's reward, its loss and its throughput, whatever framework logged it.

The TensorBoard PPO metric set names its series ``Train/AvgReward`` and ``Train/Loss``; SB3
writes ``rollout/ep_rew_mean`` and ``train/loss``, the Hugging Face Trainer ``loss``, TRL ``reward``, CleanRL
``charts/episodic_return``. The stream config holds a catalog of names per role (defaults in
``schemas._catalog``, extensible); each run binds each role to the first catalog name it logs
(within one record, the earlier catalog entry wins) and keeps it for the rest of the run, so
the epoch series, trends and the rules scoped to ``@reward`` follow that series.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class RoleBinding:
    """One run's binding of a role to a series: the first catalog name the run logs."""

    __slots__ = ("_order", "name")

    def __init__(self, catalog: Sequence[str]) -> None:
        self._order = {n: i for i, n in enumerate(reversed(catalog))}  # first entry: highest rank
        self.name: str | None = None

    def bind(self, names: Iterable[str]) -> str | None:
        """Bind to the best catalog entry among ``names`` if not bound yet; the name it just bound."""
        if self.name is not None:
            return None
        order = self._order
        self.name = max((n for n in names if n in order), key=order.__getitem__, default=None)
        return self.name
