"""run.watch on a small MLP (issue 10, point 5): norms equal clip_grad_norm_'s figure; a NaN
gradient raises the default rule's alert."""

from __future__ import annotations

import math
import time

import pytest

from metricbus.schemas import default_codec
from metricbus.sinks import read_table

from .conftest import read_topic

torch = pytest.importorskip("torch", reason="torch is an optional extra; `make test` installs it")
pytestmark = pytest.mark.integration


def test_watch_logs_the_norms_clip_grad_norm_reports_and_a_nan_gradient_alerts(settings, sink, worker):
    from metricbus.producers import Run

    sink(flush_interval=0.3)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    run = Run("watch", settings=settings, system_metrics=False)
    watcher = run.watch(model, log="all", every=2, optimizer=opt)
    assert watcher is not None
    truth = {}
    for step in range(6):
        x = torch.randn(16, 4)
        if step == 4:
            x[0, 0] = math.nan  # a poisoned batch: NaN gradients
        opt.zero_grad()
        loss = ((model(x) - 1.0) ** 2).mean()
        run.log({"Train/Loss": float(loss.detach())}, step=step)
        loss.backward()
        truth[step] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=math.inf))
        layer0 = float(torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model[0].parameters()])))
        if step == 0:
            first_layer = layer0
        opt.step()
    assert run.finish(timeout=20)

    deadline = time.monotonic() + 60
    got: dict = {}
    while time.monotonic() < deadline:
        try:
            table = read_table(settings.archive_dir, run.run_id, columns=["name", "step", "value", "kind"])
            got = {}
            for n, s, v, k in zip(*(table[c].to_pylist() for c in ("name", "step", "value", "kind"))):
                got.setdefault(n, {})[s] = (v, k)
        except (FileNotFoundError, ValueError, KeyError):
            pass
        if len(got.get("grad/total_norm", {})) >= 3:
            break
        time.sleep(0.5)
    norms = {s: v for s, (v, _) in got["grad/total_norm"].items()}
    assert sorted(norms) == [0, 2, 4]  # every 2nd backward pass, at the step logged before it
    assert norms[0] == pytest.approx(truth[0], rel=1e-6) and norms[2] == pytest.approx(truth[2], rel=1e-6)
    assert math.isnan(norms[4]) and math.isnan(truth[4])
    assert got["grad/nonfinite"][4][0] == 1.0 and got["grad/nonfinite"][0][0] == 0.0
    assert got["grad/0/norm"][0][0] == pytest.approx(first_layer, rel=1e-6)
    assert got["lr/group0"][0][0] == 0.1
    assert "Histogram" in got["parameters/0.weight"][0][1] and "Histogram" in got["gradients/2.bias"][2][1]

    codec = default_codec()
    deadline = time.monotonic() + 30
    alerts: list = []
    while time.monotonic() < deadline and not alerts:
        alerts = [
            a
            for a in (
                codec.decode(r.value)[1] for r in read_topic(settings, settings.topics.alerts, 1, timeout=5)
            )
            if a["rule"] == "nan_gradient" and a["run_id"] == run.run_id
        ]
    assert [(a["state"], a["step"]) for a in alerts][:1] == [("firing", 4)]
