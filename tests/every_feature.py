"""One run's events that use every feature the worker derives from (for tests over all its series)."""

from __future__ import annotations

from typing import Any

import numpy as np

from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, run_started


def every_feature_run() -> list[tuple[str, dict[str, Any], int]]:
    """Scalars of every role, a catalog throughput and a tokens/s, arrays, rubric criteria,
    labels, epochs and two ranks: ``(kind, body, ts_ms)`` for ``derive_all``."""
    rng = np.random.default_rng(0)
    events: list[tuple[str, dict[str, Any], int]] = [(RUN_STARTED, run_started("p", "n", world_size=2), 0)]
    for step in range(40):
        for rank in (0, 1):
            body: dict[str, Any] = {
                "step": step,
                "epoch": step // 10,
                "rank": rank,
                "scalars": {"Train/Loss": 1.0 / (step + 1)},
                "samples": {},
            }
            if rank == 0:
                body["scalars"].update(
                    {
                        "Train/AvgReward": step / 40,
                        "Generation_TokensPerSec": 100.0 + step,
                        "time/fps": 50.0 + step % 3 / 2,  # not whole numbers: a metric, not a counter
                        "Train/NumSamples": 8.0,
                        "Teacher_APITokens": 10.0,
                    }
                )
                body["samples"] = {
                    k: rng.random(8).tolist()
                    for k in ("rewards/format", "criteria/rubric/clarity", "Train/Reward", "scores")
                }
                body["labels"] = {"task": "logo_a" if step % 2 else "logo_b"}
            events.append((METRICS, body, 1000 + step * 10 + rank))
    events.append((RUN_FINISHED, {"status": "finished", "summary": {}}, 99999))
    return events
