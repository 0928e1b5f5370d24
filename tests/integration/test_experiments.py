"""Experiments: the demo's PPO, three learning rates × three seeds, through the real stack, then
`metricbus compare --project --group-by` and `metricbus.runs()` read back against numpy and scipy."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from metricbus.producers import Run
from metricbus.sinks import read_table

from .conftest import CHROMIUM, cli, get

pytestmark = pytest.mark.integration

# the demo's default, another, and one too large to learn with: in 10 updates the default's final
# rewards are ~95-100 in each seed, 1e-3's 50-60, and 1.0's 9-31 where a random policy gets ~20
# (0.1 is not used: how well it learns depends on the machine's floating point)
RATES = (2.5e-3, 1e-3, 1.0)
SEEDS = (1, 2, 3)
REWARD = "Train/AvgReward"
HOSTILE = "<img src=x onerror=alert(1)></script><script>alert(2)</script>"


class Logged:
    """The run, and every reward it was given (an update with no finished episode logs none)."""

    def __init__(self, run: Run) -> None:
        self.run, self.rewards = run, 0

    def log(self, data, **kw) -> None:
        self.rewards += REWARD in data
        self.run.log(data, **kw)

    def __getattr__(self, name):
        return getattr(self.run, name)


def train_grid(settings) -> tuple[dict[str, tuple[float, int]], dict[str, int]]:
    """run id -> (learning rate, seed), and how many rewards each logged; every run finished."""
    from metricbus.demo._ppo import PPOConfig, train

    runs, logged = {}, {}
    for lr in RATES:
        for seed in SEEDS:
            cfg = PPOConfig(updates=10, learning_rate=lr, seed=seed)
            run = Logged(
                Run("sweep", name=f"lr{lr:g}-s{seed}", config=cfg, settings=settings, system_metrics=False)
            )
            train(run, cfg)
            assert run.finish(timeout=30)
            runs[run.run_id], logged[run.run_id] = (lr, seed), run.rewards
    return runs, logged


def archived_rewards(settings, logged, timeout=60.0) -> dict[str, tuple[list[int], list[float]]]:
    """Each run's (steps, Train/AvgReward values), read with pyarrow once the archive holds them all."""
    deadline = time.monotonic() + timeout
    while True:
        table = read_table(settings.archive_dir, project="sweep", columns=["run_id", "name", "step", "value"])
        rows = sorted((r["run_id"], r["step"], r["value"]) for r in table.to_pylist() if r["name"] == REWARD)
        out = {
            run: ([s for r, s, _ in rows if r == run], [v for r, _, v in rows if r == run]) for run in logged
        }
        if all(len(out[r][0]) == n for r, n in logged.items()) or time.monotonic() > deadline:
            return out
        time.sleep(0.5)


def test_compare_groups_a_sweep_by_learning_rate_names_the_best_and_flags_the_broken_one(settings, sink):
    pytest.importorskip("gymnasium", reason="the demo's PPO needs the demo extra; `make test` installs it")
    sink(flush_interval=0.3)
    runs, logged = train_grid(settings)
    archived = archived_rewards(settings, logged)
    assert {r: len(steps) for r, (steps, _) in archived.items()} == logged
    rewards = {r: values for r, (_, values) in archived.items()}

    result = subprocess.run(
        cli(
            settings,
            "compare",
            "--project",
            "sweep",
            "--group-by",
            "learning_rate",
            "--metric",
            REWARD,
            "--json",
        ),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1, result.stdout + result.stderr  # exit 1: a regression
    got = json.loads(result.stdout)
    # independently: each run's final window (the last 5: the last tenth of at most 10, at least 5)
    finals = {run: float(np.mean(values[-5:])) for run, values in rewards.items()}
    groups = {f"learning_rate={lr!r}": [r for r, (rate, _) in runs.items() if rate == lr] for lr in RATES}
    assert {g: sorted(m) for g, m in got["groups"].items()} == {g: sorted(m) for g, m in groups.items()}
    assert got["baseline_group"] == "learning_rate=0.0025"  # the first run's group
    scores = {s["group"]: s for s in got["group_scores"]}
    iqms = {}
    for group, members in groups.items():
        mine = np.array([finals[r] for r in members])
        iqms[group] = stats.trim_mean(mine, 0.25)
        assert scores[group]["iqm"] == pytest.approx(iqms[group])
        assert scores[group]["std"] == pytest.approx(np.std(mine, ddof=1))
        want = stats.bootstrap(
            (mine,),
            lambda x, axis: stats.trim_mean(x, 0.25, axis=axis),
            n_resamples=2000,
            method="percentile",
            rng=np.random.default_rng(0),
        ).confidence_interval
        assert scores[group]["interval"] == pytest.approx([want.low, want.high])
    best = max(iqms, key=iqms.get)
    assert [g for g, s in scores.items() if s["best"]] == [best]  # reward: higher is better
    assert best != "learning_rate=1.0"  # the demo's default or its neighbour; never the broken rate

    verdicts = {c["group"]: c for c in got["group_metrics"]}
    base = [finals[r] for r in groups["learning_rate=0.0025"]]
    for group, c in verdicts.items():
        mine = [finals[r] for r in groups[group]]
        assert c["p_value"] == pytest.approx(stats.ttest_ind(mine, base, equal_var=False).pvalue)
    broken = verdicts["learning_rate=1.0"]
    # the verdict agrees with the interval printed beside it: Welch's, of the difference of means
    assert broken["verdict"] == "worse" and broken["interval"][1] < 0
    for c in got["group_metrics"]:
        mine = [finals[r] for r in groups[c["group"]]]
        ci = stats.ttest_ind(mine, base, equal_var=False).confidence_interval(0.95)
        assert c["interval"] == pytest.approx([ci.low, ci.high])
        assert (c["verdict"] == "cannot tell") == (ci.low < 0 < ci.high)
    assert [r["group"] for r in (c for c in got["group_metrics"] if c["verdict"] == "worse")]

    text = subprocess.run(
        cli(settings, "compare", "--project", "sweep", "--group-by", "learning_rate", "--metric", REWARD),
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    assert "learning_rate=1.0" in text and "REGRESSION" in text and "<- best" in text
    best_line = next(line for line in text.splitlines() if "<- best" in line)
    assert "learning_rate=0.0025" in best_line and f"IQM {iqms[best]:.4g}" in best_line

    import metricbus

    frame = metricbus.runs("sweep", settings=settings)
    assert sorted(frame["run_id"]) == sorted(runs)
    assert {(r["config/learning_rate"], r["config/seed"]) for _, r in frame.iterrows()} == set(runs.values())
    curves = metricbus.curves("sweep", REWARD, group_by=["learning_rate"], settings=settings)
    assert set(curves["group"]) == set(groups)
    for group, members in groups.items():
        mine = curves[curves["group"] == group].sort_values("step")
        # runs that logged at other steps: each interpolated onto the steps all of them cover
        lo = max(archived[r][0][0] for r in members)
        hi = min(archived[r][0][-1] for r in members)
        grid = sorted({s for r in members for s in archived[r][0] if lo <= s <= hi})
        lines = np.array([np.interp(grid, *archived[r]) for r in members])
        assert mine["step"].tolist() == grid
        assert mine["mean"].to_numpy() == pytest.approx(lines.mean(axis=0))
        assert mine["upper"].to_numpy() == pytest.approx(lines.mean(axis=0) + lines.std(axis=0, ddof=1))
        assert (mine["runs"] == 3).all()


def archive_sweep(archive, rng) -> dict[str, tuple[float, int]]:
    """Six runs of project sweep (lr 0.001 and 0.01, three seeds each) and one of another project."""
    from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Event, default_codec, run_started
    from metricbus.sinks import ParquetArchive

    fp = default_codec().newest("EventBatch").fingerprint
    sink = ParquetArchive(archive)
    sink.open()
    runs = {}
    plan = (
        [(0.001, s, "sweep") for s in range(3)] + [(0.01, s, "sweep") for s in range(3)] + [(0.1, 0, "other")]
    )
    for k, (lr, seed, project) in enumerate(plan):
        run_id = f"20261101-00000{k}-sweep{k:03d}"
        config = {"lr": lr, "seed": seed, "model": {"width": 64}}
        if project == "other":  # config keys and values are untrusted: they stay text on the page
            config[HOSTILE] = HOSTILE
        events = [
            Event(
                run_id,
                "p",
                0,
                1_700_000_000_000 + k,
                RUN_STARTED,
                run_started(project, f"lr{lr:g}-s{seed}", config),
                fp,
            )
        ]
        level = 100.0 if lr == 0.001 else 60.0
        for step in range(50):
            value = level * (1 - math.exp(-step / 10)) + rng.normal(0, 3)
            body = {
                "step": step,
                "epoch": None,
                "rank": 0,
                "samples": {},
                "labels": {},
                "scalars": {REWARD: value, "Train/Loss": 1 / (step + 1)},
            }
            events.append(Event(run_id, "p", step + 1, 1_700_000_001_000 + step, METRICS, body, fp))
        events.append(
            Event(
                run_id,
                "p",
                51,
                1_700_000_002_000,
                RUN_FINISHED,
                {"status": "finished", "summary": {"score": level}},
                fp,
            )
        )
        sink.write(events)
        if project == "sweep":
            runs[run_id] = (lr, seed)
    sink.flush()
    sink.close()
    return runs


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_the_experiments_page_sorts_filters_groups_six_runs_by_lr_and_remembers(
    settings, dashboard, tmp_path
):
    from playwright.sync_api import expect, sync_playwright

    runs = archive_sweep(settings.archive_dir, np.random.default_rng(0))
    deadline = time.monotonic() + 30
    while len(json.loads(get(f"{dashboard}/api/experiments")[1])["runs"]) < 7 and time.monotonic() < deadline:
        time.sleep(0.3)
    table = json.loads(get(f"{dashboard}/api/experiments?project=sweep")[1])
    assert sorted(r["run_id"] for r in table["runs"]) == sorted(runs) and table["differ"] == ["lr"]
    shots = Path(os.environ.get("METRICBUS_SCREENSHOTS") or tmp_path)

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1280, "height": 1100})
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        page.goto(f"{dashboard}/experiments")
        expect(page.locator("#runs-table")).to_have_attribute("data-rows", "7", timeout=30_000)
        expect(page.locator("#columns")).to_contain_text(HOSTILE)  # a config key, as text
        page.locator("#runs-filter").fill("script")  # its value too: found by the filter, as text
        expect(page.locator("#runs-table")).to_have_attribute("data-rows", "1")
        page.locator("#runs-filter").fill("")
        # sort by a config column (lr), then the other way
        page.locator('th[data-sort="config/lr"]').click()
        first = page.locator("#runs tbody tr").first
        expect(first).to_contain_text("lr0.001")
        page.locator('th[data-sort="config/lr"]').click()
        expect(first).to_contain_text("lr0.1-s0")
        # filter: a config value
        page.locator("#runs-filter").fill("lr=0.01")
        expect(page.locator("#runs-table")).to_have_attribute("data-rows", "3")
        page.locator("#runs-filter").fill("")
        # a project: its six runs chosen, grouped by the key that differs (lr; seeds are not a group)
        page.locator("#project").select_option("sweep")
        expect(page.locator("#runs-table")).to_have_attribute("data-rows", "6")
        chart = page.locator("#group-chart")
        expect(chart).to_have_attribute("data-groups", "2", timeout=30_000)
        expect(chart).to_have_attribute("data-bands", "2")
        expect(page.locator("#metric")).to_have_value(REWARD)
        expect(page.locator("#group-table")).to_contain_text("lr=0.001")
        best = page.locator("#group-table tr", has_text="best")
        expect(best).to_contain_text("lr=0.001")
        expect(page.locator("#group-table")).to_contain_text("REGRESSION")  # lr 0.01 against lr 0.001
        drawn = page.evaluate("window.mbExperiment")
        assert {b["group"] for b in drawn["bands"]} == {"lr=0.001", "lr=0.01"}
        assert all(
            len(b["runs"]) == 3 and b["upper"][-1] > b["mean"][-1] > b["lower"][-1] for b in drawn["bands"]
        )
        page.locator("#smoothing").fill("0.6")
        page.screenshot(path=str(shots / "experiments-grouped.png"), full_page=True)
        # the view is remembered: the page opened again, with no address, shows it
        page.goto(f"{dashboard}/experiments")
        expect(chart).to_have_attribute("data-groups", "2", timeout=30_000)
        expect(page.locator("#project")).to_have_value("sweep")
        expect(page.locator("#smoothing")).to_have_value("0.6")
        # no grouping: a curve per run
        for box in page.locator("#group-by input:checked").all():
            box.uncheck()
        expect(chart).to_have_attribute("data-groups", "6", timeout=30_000)
        expect(chart).to_have_attribute("data-bands", "0")
        page.screenshot(path=str(shots / "experiments-runs.png"), full_page=False)
        browser.close()
    assert dialogs == []  # nothing of a run's config ran


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_the_reports_groups_are_drawn_full_width_with_their_bands_and_iqms(settings, tmp_path):
    from playwright.sync_api import sync_playwright

    runs = archive_sweep(settings.archive_dir, np.random.default_rng(1))
    first, *others = runs
    out = tmp_path / "report.html"
    args = ["report", first, *(a for r in others for a in ("--compare", r)), "--out", str(out)]
    done = subprocess.run(cli(settings, *args), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        page = browser.new_page(viewport={"width": 1300, "height": 900})
        page.goto(out.as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=10_000)
        charts = page.locator("#group-charts .chart")
        assert charts.count() == 2  # the two metrics the six runs share, reward and loss
        reward = page.locator(f"#group-charts .chart[data-metric='{REWARD}']")
        assert reward.get_attribute("data-groups") == "2"
        width = page.evaluate(
            f"document.querySelector(\"#group-charts .chart[data-metric='{REWARD}'] canvas\").clientWidth"
        )
        assert width > 1000  # the page's width, not a 400 px column
        scores = page.locator("#group-scores").inner_text()
        assert "lr=0.001 (best)" in scores and "REGRESSION" in scores
        reward.screenshot(
            path=str(Path(os.environ.get("METRICBUS_SCREENSHOTS") or tmp_path) / "report-groups.png")
        )
        browser.close()


def test_compare_says_which_keys_and_groups_there_are_when_asked_for_others(settings):
    archive_sweep(settings.archive_dir, np.random.default_rng(2))

    def compare(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(cli(settings, "compare", *args), capture_output=True, text=True, timeout=120)

    wrong_key = compare("--project", "sweep", "--group-by", "learning_rate")
    assert wrong_key.returncode == 2
    assert (
        "--group-by learning_rate: no run's config has it; their keys: lr, model/width, seed"
        in wrong_key.stderr
    )
    wrong_group = compare("--project", "sweep", "--baseline", "lr=5")
    assert wrong_group.returncode == 2 and "the groups: lr=0.001, lr=0.01" in wrong_group.stderr
    none = compare("--project", "nope")
    assert none.returncode == 2 and "no run of project 'nope'" in none.stderr
    by_group = compare("--project", "sweep", "--baseline", "lr=0.01", "--metric", REWARD)
    assert (
        by_group.returncode == 0 and "baseline lr=0.01;" in by_group.stdout
    )  # the better group: no regression
    assert "lr=0.001" in next(line for line in by_group.stdout.splitlines() if "<- best" in line)


def archive_loss_sweep(archive) -> dict[str, float]:
    """Two learning rates x three seeds of a loss: one group 66x lower, with a spread the other has not."""
    from metricbus.schemas import METRICS, RUN_FINISHED, RUN_STARTED, Event, default_codec, run_started
    from metricbus.sinks import ParquetArchive

    fp = default_codec().newest("EventBatch").fingerprint
    sink = ParquetArchive(archive)
    sink.open()
    finals = {}
    plan = [(0.003, s, level) for s, level in enumerate((0.62, 1.31, 0.08))]
    plan += [(0.01, s, level) for s, level in enumerate((0.0099, 0.0103, 0.0102))]
    for k, (lr, seed, level) in enumerate(plan):
        run_id = f"20261102-00000{k}-losses{k:02d}"
        start = run_started("loss-sweep", f"lr{lr:g}-s{seed}", {"lr": lr, "seed": seed})
        events = [Event(run_id, "p", 0, 1_700_000_000_000 + k, RUN_STARTED, start, fp)]
        for step in range(50):
            body = {"step": step, "epoch": None, "rank": 0, "samples": {}, "labels": {}}
            body["scalars"] = {"Train/Loss": level}  # its final window: exactly the run's level
            events.append(Event(run_id, "p", step + 1, 1_700_000_001_000 + step, METRICS, body, fp))
        events.append(Event(run_id, "p", 51, 1_700_000_002_000, RUN_FINISHED, {"status": "finished"}, fp))
        sink.write(events)
        finals[run_id] = level
    sink.flush()
    sink.close()
    return finals


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: `make test` installs it")
def test_a_verdict_never_contradicts_the_interval_beside_it_in_the_cli_the_json_or_the_page(
    settings, dashboard, tmp_path
):
    """A 2 x 3 sweep whose lower loss three seeds cannot separate: the interval holds 0, and the
    verdict says so, with the runs it would take, everywhere a person reads it."""
    from playwright.sync_api import expect, sync_playwright

    archive_loss_sweep(settings.archive_dir)
    base, lower = [0.62, 1.31, 0.08], [0.0099, 0.0103, 0.0102]
    ci = stats.ttest_ind(lower, base, equal_var=False).confidence_interval(0.95)
    assert ci.low < 0 < ci.high
    args = ("compare", "--project", "loss-sweep", "--group-by", "lr", "--metric", "Train/Loss")
    got = json.loads(
        subprocess.run(cli(settings, *args, "--json"), capture_output=True, text=True, timeout=120).stdout
    )
    (c,) = got["group_metrics"]
    assert c["interval"] == pytest.approx([ci.low, ci.high]) and c["verdict"] == "cannot tell"
    assert c["needed"] > 3 and f"about {c['needed']} runs a group would separate" in c["said"]
    text = subprocess.run(cli(settings, *args), capture_output=True, text=True, timeout=120)
    assert text.returncode == 0, text.stdout  # nothing worse: no regression
    line = next(x for x in text.stdout.splitlines() if "vs baseline" in x)
    assert f"[{ci.low:.4g}, {ci.high:.4g}]" in line and "cannot tell at 95 %: 3 vs 3 runs" in line
    assert "no significant change" not in text.stdout
    best = next(x for x in text.stdout.splitlines() if "<- best IQM" in x)
    assert "lr=0.01" in best  # the lower loss has the best IQM; the verdict says it is not yet shown

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"{dashboard}/experiments#project=loss-sweep&metric=Train%2FLoss&group=lr")
            page.locator("#project").select_option("loss-sweep")
            page.locator("#metric").select_option("Train/Loss")
            row = page.locator("#group-table tr", has_text="lr=0.01")
            expect(row).to_contain_text("cannot tell", timeout=30_000)
            expect(row).to_contain_text(f"[{ci.low:.4g}, {ci.high:.4g}]")
            expect(row).to_contain_text(f"about {c['needed']} runs a group would separate")
            page.screenshot(path=str(tmp_path / "verdict.png"), full_page=True)
        finally:
            browser.close()
