"""Schema-valid hostile records: every event kind, its fields at the ends of their types.

What a topic may hold that decodes cleanly (``tests/chaos.py`` fuzzes the bytes): steps, seqs and
times at both ends of 64 bits, ±1e308 and NaN, histograms whose edges and counts do not fit,
table rows shorter or longer than their columns, configs that are no JSON object or nest past the
recursion limit, world sizes of 2**31 - 1, names with control characters, alerts with unusable
run ids or repeated. Seeded: a failure replays. Used by ``tests/unit/test_hostile_records.py``; a longer run is a loop over seeds.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

from metricbus.schemas import (
    CONFIG_UPDATE,
    HEARTBEAT,
    HISTOGRAM,
    MEDIA,
    MEDIA_TYPES,
    METRICS,
    RUN_FINISHED,
    RUN_STARTED,
    TABLE,
    Codec,
    digest_of,
    encode_aggregates,
    encode_events,
    ref_of,
)

LONG = 2**63 - 1
NAMES = [
    "Train/Loss",
    "train/loss",
    "rewards/format_exact",
    "Epoch/AvgLoss",
    "time/fps",
    "a",
    "x" * 300,
    "Loss/../../etc",
    "sp ace",
    "é",
    "\u202e",
    "a\x00b",
    "x\n[RESOLVED] forged",
    "\x1b[2J",
    "<script>",
    "",
    "_step",
    "_timestamp",
    "_metricbus_id",
    "metricbus/step",
]
TEXT = ["", "x", "task", "\x00", "a" * 500, "é/..", "timeout", "\x1b[31m"]
CONFIGS = [
    "{}",
    "[]",
    "[1]",
    "null",
    "nope",
    '{"a": {"b": 1}}',
    '{"lr": NaN}',
    "1e999",
    '{"a": ' + "[" * 50_000 + "]" * 50_000 + "}",
]


def _media_blobs() -> dict[str, tuple[str, bytes]]:
    import numpy as np

    from metricbus.producers._media import encode_audio, encode_image, encode_text, encode_video

    made = [
        encode_image(np.zeros((2, 3, 3), np.uint8), "x")[0],
        encode_video(np.zeros((2, 2, 2, 3), np.uint8), 4, "x")[0],
        encode_audio(np.zeros(8), 8000, "x")[0],
        encode_text("a <b>text</b>\x00")[0],
    ]
    return {kind: (kind, data) for kind, data in zip(MEDIA_TYPES, made, strict=True)}


#: real bytes of each media kind: a test puts them in the store its sinks read
MEDIA_BLOBS = _media_blobs()


class Hostile:
    """A seeded source of hostile bodies and records."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)

    def value(self) -> float:
        r = self.rng
        return r.choice(
            [0.0, -0.0, 1.0, math.nan, math.inf, -math.inf, 1e308, -1e308, 5e-324, r.uniform(-1e6, 1e6)]
        )

    def long(self) -> int:
        r = self.rng
        return r.choice([0, 1, -1, LONG, -LONG - 1, r.randint(-1000, 1000), 2**31])

    def name(self) -> str:
        return self.rng.choice(NAMES)

    def text(self) -> str:
        return self.rng.choice(TEXT)

    def body(self, kind: str) -> dict[str, Any]:
        r = self.rng
        if kind == METRICS:
            return {
                "step": self.long(),
                "epoch": r.choice([None, self.long()]),
                "rank": r.choice([0, 1, -1, 2**31 - 1]),
                "scalars": {self.name(): self.value() for _ in range(r.randint(0, 5))},
                "samples": {
                    self.name(): [self.value() for _ in range(r.randint(0, 6))]
                    for _ in range(r.randint(0, 2))
                },
                "labels": {self.text(): self.text() for _ in range(r.randint(0, 3))}
                if r.random() < 0.3
                else {},
            }
        if kind == HISTOGRAM:
            n = r.randint(0, 5)
            return {
                "step": self.long(),
                "name": self.name(),
                "edges": [self.value() for _ in range(r.choice([n + 1, n, 0]))],
                "counts": [self.long() for _ in range(n)],
                "rank": r.choice([0, -1]),
            }
        if kind == RUN_STARTED:
            return {
                "project": self.text(),
                "name": self.text(),
                "config_json": r.choice(CONFIGS),
                "tags": [self.text()],
                "host": self.text(),
                "pid": r.choice([0, -1, 2**31 - 1]),
                "git": r.choice([None, self.text()]),
                "rank": r.choice([0, 1, -5, 2**31 - 1]),
                "world_size": r.choice([1, 0, -1, 4, 2**31 - 1]),
            }
        if kind == RUN_FINISHED:
            return {"status": r.choice(["finished", "", "\x1b[2J"]), "summary": {self.name(): self.value()}}
        if kind == HEARTBEAT:
            return {"last_step": r.choice([None, self.long()])}
        if kind == TABLE:
            columns = [self.text() for _ in range(r.randint(0, 3))]
            return {
                "step": self.long(),
                "name": self.name(),
                "columns": columns,
                "rows": [
                    [
                        r.choice([None, True, 1, 1.5, "x", math.nan])
                        for _ in range(r.choice([len(columns), 0, 4]))
                    ]
                    for _ in range(r.randint(0, 3))
                ],
            }
        if kind == MEDIA:  # whole, or one field unlike its bytes (kind, type, size, reference, ...)
            media_kind, data = r.choice(list(MEDIA_BLOBS.values()))
            digest = digest_of(data)
            body = {
                "step": self.long(),
                "name": self.name(),
                "rank": r.choice([0, -1]),
                "kind": media_kind,
                "media_type": MEDIA_TYPES[media_kind],
                "size": len(data),
                "digest": digest,
                "ref": ref_of(digest),
                "caption": r.choice([None, self.text()]),
                "width": r.choice([2, 0, -1, 2**31 - 1]),
                "height": r.choice([3, 0, -1, 2**31 - 1]),
                "frames": self.long(),
                "rate": self.value(),
                "channels": r.choice([3, 1, 0, -1, 2**31 - 1]),
            }
            if r.random() < 0.5:
                field, value = r.choice(
                    [
                        ("kind", r.choice([*MEDIA_TYPES, "html", ""])),
                        ("media_type", r.choice(["text/html", "", "image/png"])),
                        ("size", r.choice([0, -1, LONG])),
                        ("ref", r.choice(["../../etc/passwd", "sha256/../../x", "", ref_of("f" * 64)])),
                    ]
                )
                body[field] = value
            return body
        assert kind == CONFIG_UPDATE
        return {"config_json": r.choice(CONFIGS), "step": r.choice([None, self.long()])}

    def event_records(self, codec: Codec, n: int) -> Iterator[bytes]:
        """``n`` EventBatch records of two runs and two producers, seqs mostly rising."""
        r = self.rng
        kinds = [METRICS] * 6 + [HISTOGRAM, RUN_STARTED, RUN_FINISHED, HEARTBEAT, TABLE, CONFIG_UPDATE, MEDIA]
        next_seq: dict[tuple[str, str], int] = {}
        for i in range(n):
            run, producer = r.choice(["r1", "r2"]), r.choice(["p1", "p2"])
            events = []
            for _ in range(r.randint(1, 8)):
                seq = next_seq.get((run, producer), 0)
                if r.random() < 0.2:
                    seq = r.choice([max(0, seq - 3), min(seq + 5, LONG), 0, LONG - 1])
                next_seq[(run, producer)] = min(seq + 1, LONG)
                kind = r.choice(kinds)
                ts = r.choice([0, 1_700_000_000_000 + i, LONG, -1])
                events.append((seq, ts, kind, self.body(kind)))
            yield encode_events(codec, run, producer, events, columnar=r.random() < 0.7)

    def aggregate_records(self, codec: Codec, n: int) -> Iterator[bytes]:
        """``n`` AggregateBatch records (what the worker would publish), hostile alike."""
        r = self.rng
        for _ in range(n):
            points = [
                {
                    "name": self.name(),
                    "source": self.name(),
                    "kind": r.choice(["recent_mean", "", "epoch_mean"]),
                    "step": self.long(),
                    "epoch": r.choice([None, self.long()]),
                    "value": self.value(),
                    "ts_ms": r.choice([0, LONG, -1]),
                }
                for _ in range(r.randint(0, 6))
            ]
            histograms = [
                {**self.body(HISTOGRAM), "source": self.name(), "ts_ms": 0} for _ in range(r.randint(0, 2))
            ]
            for h in histograms:
                del h["rank"]
            tables = [{**self.body(TABLE), "ts_ms": 0} for _ in range(r.randint(0, 1))]
            first_seq = r.choice([0, 10, -1, LONG - 3])
            yield encode_aggregates(
                codec,
                r.choice(["r1", "r2"]),
                points,
                histograms,
                tables,
                first_seq=first_seq,
                closes_run=r.random() < 0.2,
            )

    def alert(self) -> dict[str, Any]:
        """One Alert (what the worker would publish): ids, states and severities it never writes."""
        r = self.rng
        return {
            "run_id": r.choice(["r1", "r2", "r1", "..", "", "a/b", "x" * 300, "\x1b[2J"]),
            "rule": r.choice([self.name(), "nan_loss"]),
            "state": r.choice(["firing", "resolved", "firing", "", "\x1b[2J", "x" * 300]),
            "severity": r.choice(["critical", "warning", "info", "", "\x00"]),
            "metric": r.choice([self.name(), "*"]),
            "value": r.choice([None, self.value()]),
            "step": r.choice([None, self.long()]),
            "message": self.text(),
            "ts_ms": r.choice([0, 1_700_000_000_000, LONG, -LONG - 1, -1]),
            "seq": r.choice([-1, 0, 1, 2, LONG, -LONG - 1]),
        }

    def alert_records(self, codec: Codec, n: int) -> Iterator[bytes]:
        """``n`` Alert records, hostile alike (some repeated: a worker re-sending after a restart)."""
        sent: list[bytes] = []
        for _ in range(n):
            value = (
                self.rng.choice(sent)
                if sent and self.rng.random() < 0.15
                else codec.encode("Alert", self.alert())
            )
            sent.append(value)
            yield value
