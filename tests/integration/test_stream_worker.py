import math
import os
import subprocess
import time

import pytest

from producers import Run
from schemas import default_codec

from .conftest import cli, read_topic

pytestmark = pytest.mark.integration


@pytest.fixture
def worker(settings, tmp_path):
    log = open(tmp_path / "worker.log", "wb")
    env = {**os.environ, **settings.to_env()}
    proc = subprocess.Popen(cli(settings, "worker"), stdout=log, stderr=subprocess.STDOUT, env=env)
    yield proc
    proc.terminate()
    try:
        proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()


def aggregates(settings, count, timeout=60.0):
    codec = default_codec()
    out = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = {}
        for record in read_topic(settings, settings.topics.aggregates, 1, timeout=5):
            _, batch = codec.decode(record.value)
            for p in batch["points"]:
                out.setdefault(p["name"], []).append(p)
        if sum(len(v) for v in out.values()) >= count:
            return out
        time.sleep(0.5)
    return out


def test_worker_derives_seed_series_and_fires_a_nan_alert_seconds_after_it_is_logged(settings, worker):
    run = Run("grpo", settings=settings, system_metrics=False)
    for step in range(20):
        run.log({"Train/Loss": 1.0 / (step + 1)}, step=step, epoch=step // 10)
        run.log({"rewards/format_exact": [0.0, 1.0, 1.0, 0.5]}, step=step, epoch=step // 10)
    run.log({"Train/Loss": math.nan}, step=20, epoch=2)
    t_nan = time.time()
    assert run.finish(timeout=20)
    alerts = []
    deadline = time.monotonic() + 60
    codec = default_codec()
    while not alerts and time.monotonic() < deadline:
        alerts = [
            codec.decode(r.value)[1] for r in read_topic(settings, settings.topics.alerts, 1, timeout=2)
        ]
    nan = [a for a in alerts if a["rule"] == "nan_loss"]
    assert nan and nan[0]["state"] == "firing" and nan[0]["step"] == 20 and nan[0]["run_id"] == run.run_id
    assert nan[0]["ts_ms"] / 1000 - t_nan < 60
    points = aggregates(settings, 100)
    assert [p["value"] for p in points["rewards/format_exact_mean"]][:3] == [0.625] * 3
    assert points["rewards/total_mean"][0]["value"] == 0.625
    assert [round(p["value"], 6) for p in points["Epoch/AvgLoss"][:2]] == [
        round(sum(1 / (s + 1) for s in range(10)) / 10, 6),
        round(sum(1 / (s + 1) for s in range(10, 20)) / 10, 6),
    ]
    assert points["final/format_exact_total_samples"][0]["value"] == 80
    assert points["final/format_exact_mean"][0]["value"] == pytest.approx(0.625)
