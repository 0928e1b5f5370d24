import math

import numpy as np
import pytest

from metricbus.schemas import METRICS, RUN_FINISHED, ConfigError, Event, default_codec
from metricbus.stream_jobs import StreamProcessor
from metricbus.stream_jobs._alerts import AlertEngine
from metricbus.stream_jobs._rules import DEFAULT_RULES, load_rules, parse_rules


def engine(yaml_text):
    return AlertEngine(parse_rules(yaml_text))


def test_the_default_rule_pack_loads_and_covers_the_seed_thresholds():
    rules = {r.name: r for r in load_rules(DEFAULT_RULES)}
    assert rules["epoch_reward_below_target"].value == 0.7 and rules["epoch_reward_below_target"].warmup > 0
    assert rules["epoch_reward_unstable"].value == 0.01
    assert rules["slow_generation"].value == 1.0
    assert rules["gpu_underused"].value == 50
    assert rules["memory_pressure"].value == 90
    assert rules["nan_loss"].kind == "nonfinite" and rules["run_stalled"].kind == "absent"


def test_threshold_with_for_fires_once_and_resolves_after_hysteresis():
    e = engine("""
rules:
  - {name: mem, kind: threshold, metric: System/Memory_Percent, op: ">", value: 90, for: 2, resolve_after_s: 10}
""")
    seq = [95, 95, 95, 50, 95, 50, 50, 50]
    ts = [0, 1000, 2000, 3000, 4000, 5000, 9000, 16000]
    alerts = [a for v, t in zip(seq, ts) for a in e.observe("r", "System/Memory_Percent", v, 1, t)]
    # one firing at the 2nd high value; the flap at 3-5 s does not resolve; resolved 10 s after it calmed
    assert [(a["state"], a["ts_ms"]) for a in alerts] == [("firing", 1000), ("resolved", 16000)]
    assert "95 > 90 for 2 evaluations" in alerts[0]["message"]


def test_warmup_skips_the_first_evaluations():
    e = engine("rules: [{name: t, kind: threshold, metric: Epoch/AvgReward, op: '<', value: 0.7, warmup: 3}]")
    fired = [bool(e.observe("r", "Epoch/AvgReward", 0.1, i, i)) for i in range(5)]
    assert fired == [False, False, False, True, False]


def test_nonfinite_glob_catches_a_nan_loss():
    e = engine("rules: [{name: nan_loss, kind: nonfinite, metric: '*Loss*'}]")
    assert e.observe("r", "Train/Loss", 0.5, 1, 1) == []
    (alert,) = e.observe("r", "Train/Loss", math.nan, 2, 2)
    assert alert["state"] == "firing" and alert["metric"] == "Train/Loss" and alert["step"] == 2
    assert e.observe("r", "Train/AvgReward", math.nan, 2, 2) == []


def test_the_cache_of_which_rules_watch_a_name_is_bounded_and_rules_still_fire(monkeypatch):
    """Names come from users: a worker of runs that each log names of their own kept them all."""
    monkeypatch.setattr("metricbus.stream_jobs._alerts.MATCHES_KEPT", 8)
    e = engine("rules: [{name: nan_loss, kind: nonfinite, metric: '*Loss*'}]")
    for i in range(100):
        e.observe("r", f"u/{i}", 1.0, i, i)
        assert len(e._matches) <= 8
    (alert,) = e.observe("r", "Train/Loss", math.nan, 2, 2)  # looked up afresh
    assert alert["state"] == "firing"


def test_zscore_and_rate():
    e = engine("""
rules:
  - {name: collapse, kind: zscore, metric: r, window: 20, z: 4, direction: below}
  - {name: jump, kind: rate, metric: r, max_change: 5}
""")
    out = []
    for i in range(30):
        out += e.observe("run", "r", 10 + 0.1 * (i % 3), i, i)
    assert out == []
    out = e.observe("run", "r", 2.0, 30, 30)
    assert {a["rule"] for a in out} == {"collapse", "jump"}


def test_absent_fires_for_a_silent_live_run_and_resolves_when_it_speaks():
    e = engine("rules: [{name: stalled, kind: absent, seconds: 60}]")
    e.seen("r1", 0)
    e.seen("done", 0, finished=True)
    assert e.check_absent(30_000) == []
    (alert,) = e.check_absent(61_000)
    assert (alert["run_id"], alert["state"]) == ("r1", "firing")
    assert e.check_absent(120_000) == []  # once, not every tick
    (back,) = e.seen("r1", 125_000)
    assert back["state"] == "resolved"


def test_alerts_encode_as_alert_records():
    e = engine("rules: [{name: nan_loss, kind: nonfinite, metric: '*'}]")
    (alert,) = e.observe("r", "Train/Loss", math.inf, 3, 3)
    codec = default_codec()
    assert codec.decode(codec.encode("Alert", alert))[1]["value"] == math.inf


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("rules: [{name: a, kind: thresh, metric: x}]", "<t>:1: rule 'a' has kind 'thresh'"),
        ("rules:\n  - name: a\n    kind: threshold\n    metric: x\n", "<t>:2: threshold rule 'a' needs 'op'"),
        (
            "rules:\n  - {name: a, kind: nonfinite}\n  - {name: a, kind: nonfinite}\n",
            "<t>:3: rule name 'a' is used twice",
        ),
        ("rules: [{name: a, kind: threshold, op: '>', value: high}]", "wrong type"),
        ("rules: [{name: a, kind: nonfinite, treshold: 3}]", "unknown field(s) ['treshold']"),
        ("rules: [ {name: a", "not valid YAML"),
        ("alerts: []", "top-level 'rules:'"),
        (
            "rules: [{name: a, kind: nonfinite, only_if: {metric: x, within: [2, 1]}}]",
            "<t>:1: rule 'a': only_if",
        ),
        ("rules: [{name: a, kind: nonfinite, only_if: {metric: x, inside: [0, 1]}}]", "only_if must be"),
    ],
)
def test_a_bad_rules_file_fails_at_load_with_the_line_and_the_fix(text, fragment):
    with pytest.raises(ConfigError) as exc:
        parse_rules(text, source="<t>")
    assert fragment in str(exc.value)


def _default_pack_on(step_rewards, epoch_len=100):
    """The default rules over a run logging these per-step average rewards, epochs of ``epoch_len``."""
    proc = StreamProcessor(rules=load_rules(DEFAULT_RULES))
    body = {"epoch": 0, "rank": 0, "samples": {}}
    events = [
        Event(
            "r",
            "p",
            i,
            1000 + i,
            METRICS,
            {**body, "step": i, "epoch": i // epoch_len, "scalars": {"Train/AvgReward": v}},
            b"",
        )
        for i, v in enumerate(step_rewards)
    ]
    events.append(
        Event("r", "p", len(events), 1100, RUN_FINISHED, {"status": "finished", "summary": {}}, b"")
    )
    return {a["rule"] for a in proc.process(events).alerts}


def test_seed_reward_rules_apply_to_unit_rewards_only():
    """The absolute reward targets assume rewards in [0, 1]; a CartPole-scale run gets none of them."""
    rng = np.random.default_rng(5)
    # low, spread and not improving over 25,000 steps (the target compares two spans of 10,000)
    unit = (0.2 + 0.4 * rng.random(25_000)).tolist()
    assert {"epoch_reward_below_target", "epoch_reward_unstable"} <= _default_pack_on(unit, 1000)
    steady = (100 + 5 * rng.random(25_000)).tolist()
    erratic = (100 + 120 * rng.random(25_000)).tolist()  # a learning RL run's spread: not a finding
    for other_scale in (steady, erratic):
        assert not _default_pack_on(other_scale, 1000)


def test_a_rule_may_watch_the_runs_reward_or_loss_by_role():
    rules = parse_rules(
        "rules:\n  - {name: low, kind: threshold, metric: '@reward', op: '<', value: 0}\n"
        "  - {name: high, kind: threshold, metric: '@loss', op: '>', value: 5}\n"
    )
    engine = AlertEngine(rules)
    assert engine.observe("r", "rollout/ep_rew_mean", -1.0, 1, 0) == []  # no role given: no rule
    (low,) = engine.observe("r", "rollout/ep_rew_mean", -1.0, 2, 0, role="@reward")
    assert (low["rule"], low["metric"]) == ("low", "rollout/ep_rew_mean")
    (high,) = engine.observe("r", "loss", 9.0, 2, 0, role="@loss")
    assert high["rule"] == "high"
    assert engine.observe("r", "@loss", 9.0, 3, 0) == []  # a series named like a role is not one
    with pytest.raises(ConfigError, match="a role is one of @reward, @loss"):
        parse_rules("rules:\n  - {name: x, kind: threshold, metric: '@rewards', op: '<', value: 0}\n")


def test_every_alert_still_firing_when_the_run_finishes_is_ended_once_with_its_identity():
    """A finished run's condition can no longer stop holding: its firing alerts close ("ended")."""
    fp = default_codec().newest("EventBatch").fingerprint
    proc = StreamProcessor(rules=load_rules(DEFAULT_RULES))
    body = {"epoch": None, "rank": 0, "samples": {}}
    events = [
        Event(
            "r",
            "p",
            i,
            1000 + i,
            METRICS,
            {**body, "step": i, "scalars": {"Train/Loss": math.nan if i >= 5 else 1.0}},
            fp,
        )
        for i in range(10)
    ]
    fired = proc.process(events).alerts
    assert [(a["rule"], a["state"]) for a in fired] == [("nan_loss", "firing")]
    finished = Event("r", "p", 10, 2000, RUN_FINISHED, {"status": "failed", "summary": {}}, fp)
    (ended,) = proc.process([finished]).alerts
    assert (ended["rule"], ended["state"], ended["metric"], ended["step"]) == (
        "nan_loss",
        "ended",
        "Train/Loss",
        9,
    )
    assert ended["seq"] == fired[0]["seq"] + 1 and "the run finished while it fired" in ended["message"]
    assert proc.process([finished]).alerts == []  # said once: a re-delivered RunFinished ends nothing more


# -- the change detectors and the target's patience ------------------------------------------

SHIFT = "rules: [{name: drop, kind: shift, metric: r, direction: below, resolve_after_s: 0}]"


def _feed(e, values, chunk=None, start=0, run="run"):
    """Every value of ``values`` at steps start, start+1, ... (1 s apart), in chunks of ``chunk``."""
    out, chunk = [], chunk or len(values)
    for lo in range(0, len(values), chunk):
        part = [float(v) for v in values[lo : lo + chunk]]
        steps = list(range(start + lo, start + lo + len(part)))
        out += e.observe_many(run, "r", part, steps, [s * 1000 for s in steps])
    return out


def test_shift_judges_each_blocks_median_against_the_spread_of_the_reference_blocks_medians():
    rng = np.random.default_rng(3)
    x = rng.standard_normal(1200)
    x[1005:] -= 3.0  # from the middle of the block of steps 1000-1019
    (alert,) = _feed(engine(SHIFT), x)
    medians = np.median(x[:1020].reshape(-1, 20), axis=1)
    reference = medians[-43:-3]  # the 40 blocks before it, leaving out the 2 just before
    z = (medians[-1] - np.median(reference)) / reference.std(ddof=1)
    assert (alert["state"], alert["step"]) == ("firing", 1019)
    assert alert["value"] == pytest.approx(medians[-1])
    assert (
        f"is {abs(z):.1f} sd below the median {np.median(reference):.4g} of steps 160-959" in alert["message"]
    )
    # the first block that fires: a CUSUM step of |z| - 3.5 past 3.5
    assert abs(z) > 7.0


def test_shift_is_silent_until_its_reference_is_full_and_on_a_constant_series_judges_by_its_floor():
    e = engine(SHIFT)
    assert _feed(e, [1.0] * 839 + [0.0]) == []  # 42 blocks before the first evaluation
    e = engine(SHIFT)
    # a constant 100: its sd is 1 % of 100; a drop to 99.5 is half of one, to 90 ten of them
    assert _feed(e, [100.0] * 860 + [99.5] * 20) == []
    (alert,) = _feed(e, [90.0] * 20, start=880)
    assert alert["step"] == 899 and "(sd 1)" in alert["message"]


def test_shift_holds_its_reference_while_it_fires_and_resolves_when_the_series_is_back():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(4000)
    x[1000:2500] -= 10  # a collapse longer than the reference: judged against the past before it
    alerts = _feed(engine(SHIFT), x, chunk=333)
    # fired at the first collapsed block; resolved once blocks after 2500 are back (3 in a row)
    (fired, resolved) = alerts
    assert (fired["state"], fired["step"], resolved["state"]) == ("firing", 1019, "resolved")
    assert resolved["step"] in (2559, 2579)  # 2579: the CUSUM took one block more to fall


def test_shift_gives_the_same_alerts_however_the_values_are_cut_into_records():
    rng = np.random.default_rng(5)
    x = rng.standard_normal(3000)
    x[1500:1510] = math.nan  # left out of its blocks
    x[2000:] += 5
    rules = "rules: [{name: s, kind: shift, metric: r, direction: both, block: 10, reference: 30}]"
    whole = _feed(engine(rules), x)
    assert whole and whole == _feed(engine(rules), x, chunk=1) == _feed(engine(rules), x, chunk=37)


def test_frozen_fires_on_a_value_repeated_window_times_unless_the_series_repeated_in_its_warmup():
    rules = "rules: [{name: f, kind: frozen, metric: r, window: 50, warmup: 100}]"
    x = list(np.random.default_rng(6).standard_normal(300))
    x[150:] = [x[150]] * 150
    (alert,) = _feed(engine(rules), x, chunk=64)
    assert (alert["rule"], alert["step"]) == ("f", 199)
    stale = [float(i // 10) for i in range(300)]  # an epoch's value logged at each of its steps
    assert _feed(engine(rules), stale) == []


def test_a_target_with_patience_leaves_an_improving_run_alone_and_fires_once_it_stalls_below():
    rules = """
rules:
  - {name: low, kind: threshold, metric: r, op: "<", value: 0.7, patience_steps: 100, resolve_after_s: 0}
"""
    rising = [0.1 + 0.5 * s / 1000 for s in range(1000)]  # below 0.7 all along, but improving
    assert _feed(engine(rules), rising) == []
    stalls = [min(0.1 + 0.5 * s / 300, 0.4) for s in range(1000)]  # flat at 0.4 from step 180
    (alert,) = _feed(engine(rules), stalls, chunk=50)
    # both spans of 100 steps flat: steps 280-379 no higher than 180-279
    assert alert["step"] == 379 and "no better than over the span before" in alert["message"]


def test_an_alert_resolves_after_resolve_after_evaluations_and_seconds_and_at_the_run_end_if_recovered():
    rules = "rules: [{name: hi, kind: threshold, metric: r, op: '>', value: 5, resolve_after: 3, resolve_after_s: 60}]"
    e = engine(rules)
    # fires at 0; false from step 1, but 3 evaluations within 60 s are not enough to resolve
    alerts = _feed(e, [9, 1, 1, 1, 1])
    assert [a["state"] for a in alerts] == ["firing"]
    (resolved,) = e.end("run", 10_000, 4)  # the run ended with the condition false 4 times
    assert resolved["state"] == "resolved" and "the run's last 4 evaluations" in resolved["message"]
    e = engine(rules)
    _feed(e, [9, 1, 1])
    (ended,) = e.end("run", 10_000, 2)  # false twice only: it ended firing
    assert ended["state"] == "ended"
    e = engine(rules)
    alerts = _feed(e, [9] + [1] * 70)  # false for 60 s and 3 evaluations: resolved then
    assert [(a["state"], a["step"]) for a in alerts] == [("firing", 0), ("resolved", 61)]


def test_a_targets_patience_reaches_back_over_a_long_run_of_short_epochs_and_judges_every_value():
    """Values above the target count too (a dip below it is judged against the whole span), and a
    long run of short epochs keeps its history at a coarser grain rather than forgetting it."""
    rules = """
rules:
  - {name: low, kind: threshold, metric: r, op: "<", value: 0.7, patience_steps: 100, patience_share: 0.1}
"""
    e = engine(rules)
    # 5,000 epochs of 50 steps: rising from 0.5 to 0.95, one dip below 0.7 late in the run
    values = [0.5 + 0.45 * i / 5000 for i in range(5000)]
    values[4000] = 0.65
    steps = [50 * i + 49 for i in range(5000)]
    fired = []
    for lo in range(0, 5000, 500):
        fired += e.observe_many(
            "run", "r", values[lo : lo + 500], steps[lo : lo + 500], [s * 10 for s in steps[lo : lo + 500]]
        )
    assert fired == []  # still improving over the last tenth of the run: no alert
    state = next(iter(e._state.values()))
    assert len(state.history) <= 1000 and sum(n for _, _, n in state.history) == 5000
    stalls = [0.6] * 3000  # flat below the target from the start: judged once two spans are seen
    (alert,) = _feed(engine(rules), stalls, chunk=100)
    assert alert["state"] == "firing" and alert["step"] == 199
