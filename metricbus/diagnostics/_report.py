"""``metricbus report``: one self-contained HTML file about a run, from the archive.

No network is needed to open it: the charts are drawn by uPlot, the dashboard's own chart
library, inlined with its MIT licence note; the data is inlined as JSON. Sections: the run
(config), health (``_health``) with its evidence, learning curves (each logged series with its
derived ``_recent_mean``/``_ema`` on the same axes; a compared run's as a dashed line; the x axis
the step, the minutes since each run started, or the wall clock in UTC, chosen on the page; a long
line thinned to :data:`MAX_LINE_POINTS`, its extremes and NaNs kept), loss
parts (policy, value, entropy, KL), the learning-rate schedule, gradient norms early / middle /
late, the reward distribution per epoch, the Epoch/* table, the alert timeline (the rules run
over the archived events, as ``metricbus backtest`` does), the per-label breakdown (health's
table and the stream's ``by_<key>/<value>/...`` series), and the comparison (``_compare``: per
run, and across seeds when compared runs share a config) when runs are given to compare with.
"""

from __future__ import annotations

import dataclasses
import html
import json
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from importlib import resources
from typing import Any

from metricbus.diagnostics._compare import compare_series
from metricbus.diagnostics._health import Seen, judge, shown_points
from metricbus.diagnostics._series import Points, Series, split
from metricbus.schemas import (
    CONFIG_UPDATE,
    DERIVED_PRODUCER,
    LOSS_ALIASES,
    MEDIA,
    METRICS,
    REWARD_ALIASES,
    RUN_FINISHED,
    RUN_STARTED,
    Event,
    MediaMissing,
    MediaStore,
    checked_media_type,
    describe_alert,
    run_config,
    strict_json,
)

_LOSS_PARTS = ("policy", "value", "entropy", "kl", "clip")
_MAX_CHARTS = 24
#: media inlined into a report, at most: items a name (its first, last and evenly between) and
#: bytes in all (a report is one file to mail or attach; the dashboard shows every item)
MEDIA_PER_NAME = 4
MEDIA_INLINE_BYTES = 4 * 2**20
#: media items a report reads per name (the earliest steps first), and names
_MEDIA_KEPT, _MEDIA_NAMES = 1000, 32
EPISODE_REWARD = "episode/reward"  #: what run.log_episode logs per episode


#: (step, value, ts_ms) in event order; a NaN/inf value is a gap in the chart (None on the page);
#: ts_ms the event's time, for the charts' wall-clock and time-since-start axes
Line = Sequence[tuple[int, float | None, int]]


@dataclasses.dataclass
class Reading:
    """What the report keeps of one run, read once a chunk at a time (:func:`read_run`).

    A run's series are held once (health's :class:`Seen` keeps the logged ones) and nothing
    else of an event is kept beyond what a section shows: a 200,000-step run's events held
    whole would take 1.3 GB.
    """

    seen: Seen = dataclasses.field(default_factory=Seen)  #: the logged events, as health reads them
    derived: Series = dataclasses.field(default_factory=dict)  #: the stream's series
    started: dict[str, Any] | None = None  #: the first RunStarted's body
    finished: list[str] = dataclasses.field(default_factory=list)  #: each RunFinished's status
    settings: list[Event] = dataclasses.field(default_factory=list)  #: RunStarted, ConfigUpdate
    epochs: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)  #: Epoch/* by epoch
    #: per samples name and epoch, the epoch's finite samples; per-episode ``episode/reward``
    #: scalars (``run.log_episode``) count as samples of that name
    samples: dict[str, dict[int, list[float]]] = dataclasses.field(default_factory=dict)
    first_ms: int | None = None  #: the earliest event's time
    #: per media name its Media events' bodies (bounded: ``_MEDIA_NAMES`` names, ``_MEDIA_KEPT`` each)
    media: dict[str, list[dict[str, Any]]] = dataclasses.field(default_factory=dict)

    @property
    def logged(self) -> Series:
        """The logged series (not the per-label ones)."""
        return {n: pts for n, pts in self.seen.series.items() if split(n)[1] is None}

    @property
    def start_ms(self) -> int | None:
        """When the run started: its RunStarted's time, else its first event's."""
        starts = [e.ts_ms for e in self.settings if e.kind == RUN_STARTED]
        return min(starts) if starts else self.first_ms

    @property
    def config(self) -> dict[str, Any]:
        return run_config(self.settings)

    def take(self, chunks: Iterable[Iterable[Event]]) -> Iterator[Event]:
        """Note what the report needs of every event; yield the logged ones (to :meth:`Seen.read`)."""
        for chunk in chunks:
            for e in chunk:
                self.first_ms = e.ts_ms if self.first_ms is None else min(self.first_ms, e.ts_ms)
                if e.kind == METRICS:
                    if e.producer_id == DERIVED_PRODUCER:
                        self._derived(e)
                        continue
                    self._sampled(e)
                elif e.kind in (RUN_STARTED, CONFIG_UPDATE):
                    self.settings.append(e)
                    if e.kind == RUN_STARTED and self.started is None:
                        self.started = e.body
                elif e.kind == RUN_FINISHED:
                    self.finished.append(e.body["status"])
                elif e.kind == MEDIA:
                    items = self.media.get(e.body["name"])
                    if items is None and len(self.media) < _MEDIA_NAMES:
                        items = self.media[e.body["name"]] = []
                    if items is not None and len(items) < _MEDIA_KEPT:
                        items.append(e.body)
                if e.producer_id != DERIVED_PRODUCER:
                    yield e

    def _derived(self, e: Event) -> None:
        step, epoch = e.body["step"], e.body["epoch"]
        for name, value in e.body["scalars"].items():
            line = self.derived.get(name) or self.derived.setdefault(name, Points())
            line.append((step, value, e.ts_ms))
            if epoch is not None and name.startswith("Epoch/"):
                self.epochs.setdefault(epoch, {})[name[len("Epoch/") :]] = value

    def _sampled(self, e: Event) -> None:
        epoch = e.body["epoch"] if e.body["epoch"] is not None else 0
        for name, values in e.body["samples"].items():
            finite = (v for v in values if math.isfinite(v))
            self.samples.setdefault(name, {}).setdefault(epoch, []).extend(finite)
        episode = e.body["scalars"].get(EPISODE_REWARD)
        if episode is not None and math.isfinite(episode):
            self.samples.setdefault(EPISODE_REWARD, {}).setdefault(epoch, []).append(episode)


def read_run(
    chunks: Iterable[Iterable[Event]],
    tap: Callable[[Iterable[Event]], Iterable[Event]] | None = None,
) -> Reading:
    """One run's :class:`Reading` from its events (``sinks.iter_events(..., derived=True)``'s chunks).

    ``tap``: a reader of the logged events on the way (``_replay.raising``, the rules' alerts).
    """
    reading = Reading()
    logged = reading.take(chunks)
    reading.seen = Seen.read(tap(logged) if tap is not None else logged)
    return reading


def _gaps(points: Line) -> Line:
    """``points`` with each NaN/inf value None (JSON has no NaN; the chart draws a gap)."""
    return [(s, v if v is not None and math.isfinite(v) else None, t) for s, v, t in points]


#: The most points a chart's line keeps (about): TensorBoard keeps 1,000 per tag, W&B's charts
#: sample 1,500. A 200,000-step run of ten metrics with every point inlined made a 93 MB page.
MAX_LINE_POINTS = 2_000


def thin(points: Line, limit: int = MAX_LINE_POINTS) -> Line:
    """At most ``limit`` of ``points``, in their order.

    The first and the last, and of each stretch of consecutive points (``limit // 3 - 1`` of
    them) its lowest and highest value and its first gap (NaN): a spike or a NaN burst stays
    visible however long the run.
    """
    if len(points) <= limit:
        return points
    buckets = max(1, limit // 3 - 1)
    size = len(points) / buckets
    keep = {0, len(points) - 1}
    for b in range(buckets):
        part = range(int(b * size), int((b + 1) * size))
        finite = [i for i in part if points[i][1] is not None]
        if finite:
            keep.add(min(finite, key=lambda i: points[i][1]))  # type: ignore[arg-type, return-value]
            keep.add(max(finite, key=lambda i: points[i][1]))  # type: ignore[arg-type, return-value]
        gap = next((i for i in part if points[i][1] is None), None)
        if gap is not None:
            keep.add(gap)
    return [points[i] for i in sorted(keep)]


def _quantiles(values: list[float]) -> list[float]:
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, int(q * len(ordered)))] for q in (0.0, 0.25, 0.5, 0.75, 1.0)]


def build(
    run_id: str,
    run: Reading,
    others: Mapping[str, Reading] | None = None,
    alerts: Sequence[Mapping[str, Any]] = (),
    media: MediaStore | None = None,
) -> str:
    """The report's HTML (a string, self-contained). ``alerts``: what the rules raised on the run.

    ``media``: the store the run's media are read from, a few of each name inlined (bounded).
    """
    others = others or {}
    logged, derived = run.logged, run.derived
    started, finished = run.started or {}, run.finished
    title = f"{started.get('name', run_id)} ({run_id})"
    health = judge(run_id, run.seen)

    charts: list[dict[str, Any]] = []

    starts = {run_id: run.start_ms, **{r: other.start_ms for r, other in others.items()}}

    def chart(
        section: str,
        name: str,
        lines: Mapping[str, Line],
        stepped: bool = False,
        overlays: Mapping[str, str] | None = None,
    ) -> None:
        """``overlays``: the run of each line that is not this run's (a compared run's)."""
        if lines and len(charts) < _MAX_CHARTS * 4:
            t0 = {line: starts[(overlays or {}).get(line, run_id)] for line in lines}
            most = max(map(len, lines.values()))
            lines = {line: thin(_gaps(points)) for line, points in lines.items()}
            note = (
                f"{max(map(len, lines.values())):,} of {most:,} points shown: each stretch's lowest, highest "
                "and first NaN"
                if most > MAX_LINE_POINTS
                else ""
            )
            charts.append(
                {
                    "section": section,
                    "title": name,
                    "lines": lines,
                    "stepped": stepped,
                    "t0": t0,
                    "note": note,
                }
            )

    loss = next((n for n in LOSS_ALIASES if n in logged), None)
    reward = next((n for n in REWARD_ALIASES if n in logged), None)
    main = [n for n in (loss, reward) if n] + sorted(
        n for n in logged if n not in (loss, reward) and not n.startswith(("System/", "grad/", "lr/"))
    )
    for name in main[:_MAX_CHARTS]:
        lines, overlays = {name: logged[name]}, {}
        for stat in ("_recent_mean", "_ema"):
            if name + stat in derived:
                lines[name + stat] = derived[name + stat]
        for other, reading in others.items():
            overlay = reading.seen.series.get(name)
            if overlay:
                lines[f"{name} ({other})"] = overlay
                overlays[f"{name} ({other})"] = other
        chart("Learning curves", name, lines, overlays=overlays)
    parts = {n: logged[n] for n in logged if any(w in n.lower() for w in _LOSS_PARTS) and n != loss}
    chart("Loss parts", "policy, value, entropy, KL", parts)
    lr = {n: v for n, v in logged.items() if n.startswith("lr/") or "learning_rate" in n}
    chart("Learning-rate schedule", "learning rate", lr)
    epochs = run.epochs

    grad = [v for _, v, _ in logged.get("grad/total_norm", ()) if math.isfinite(v)]
    grad_rows = []
    if len(grad) >= 3:
        third = len(grad) // 3
        for label, part in (("early", grad[:third]), ("middle", grad[third:-third]), ("late", grad[-third:])):
            grad_rows.append([label, len(part), *_quantiles(part)])
    reward_rows = []
    samples = run.samples
    reward_samples = next((n for n in REWARD_ALIASES if n in samples), None) or next(
        iter(sorted(samples)), None
    )  # episode/reward is in the catalog: per-episode rewards come before other samples
    if reward_samples is not None:
        for epoch, values in sorted(samples[reward_samples].items()):
            if values:
                reward_rows.append([epoch, len(values), *_quantiles(values)])

    comparison_rows, group_rows = [], []
    group_bands: list[dict[str, Any]] = []
    score_rows: list[list[Any]] = []
    diff: dict[str, dict[str, Any]] = {}
    groups: dict[str, list[str]] = {}
    if others:
        runs = {run_id: run, **others}
        shared = [n for n in main if all(n in other.seen.series for other in others.values())]
        chosen = set(shared) or set(run.seen.series)  # none shared: every series they have in common
        result = compare_series(
            {r: reading.config for r, reading in runs.items()},
            # only the series compared (a copy of each on the step axis is made)
            {r: {n: s for n, s in reading.seen.series.items() if n in chosen} for r, reading in runs.items()},
            run_id,
            shared,
        )
        diff, groups = result.config_diff, result.groups
        if any(len(members) > 1 for members in groups.values()):
            group_bands = _group_bands(result, runs)
            score_rows = _score_rows(result)
        for m in result.metrics:
            comparison_rows.append(
                [m.metric, m.run, m.baseline_mean, m.mean, m.p_value, m.effect_size, m.verdict]
            )
        for g in result.group_metrics:
            group_rows.append(
                [
                    g.metric,
                    g.group,
                    len(g.means),
                    g.baseline_mean,
                    g.mean,
                    g.p_value,
                    g.effect_size,
                    g.verdict,
                ]
            )

    timeline: dict[str, list[tuple[int, float | None, int]]] = {}
    for a in alerts:
        if a.get("step") is not None:
            timeline.setdefault(f"{a['rule']} ({a['metric']})", []).append(
                (a["step"], 1.0 if a["state"] == "firing" else 0.0, a["ts_ms"])
            )
    chart(
        "Alert timeline",
        "firing (1) / resolved (0), by rule",
        dict(list(timeline.items())[:_MAX_CHARTS]),
        stepped=True,
    )
    for key, per_title in _by_label(derived, reward).items():
        for what, by_value in per_title.items():
            chart("Per label", f"{key}: {what}", by_value)

    data = {"charts": charts, "groups": group_bands}
    page = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>metricbus report: {html.escape(title)}</title>",
        f"<style>{_own('report.css')}\n{_asset('uPlot.min.css')}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f"<p class='muted'>project {html.escape(str(started.get('project', '?')))} · "
        f"{html.escape(finished[-1] if finished else 'not finished')} · "
        f"{len(logged)} logged series, {sum(len(v) for v in logged.values())} points "
        "(a per-sample array: its per-step mean)</p>",
        "<h2>Health</h2>",
        f"<p id='score' class='score'>{health.score:.0f}/100</p>",
        _table(
            ["part", "points", "deducted", "evidence"],
            [
                [p.name, f"{kept:.1f} of {p.weight}", f"{lost:.1f}", "; ".join(p.evidence) or "-"]
                for p, (kept, lost) in ((p, shown_points(p.weight, p.deducted)) for p in health.parts)
            ],
            "health",
        ),
        "<p class='muted'><label>x axis <select id='xaxis'>"
        "<option value='step'>step</option>"
        "<option value='relative'>time since the run started (minutes)</option>"
        "<option value='wall'>wall clock (UTC)</option>"
        "</select></label></p>",
        "<div id='charts'></div>",
        "<h2>Media</h2>",
        _media_section(run.media, media),
        "<h2>Epochs</h2>",
        _epoch_table(epochs) if epochs else "<p class='muted'>no Epoch/* series (log with epoch=)</p>",
        "<h2>Gradient norm, early / middle / late</h2>",
        _table(["phase", "n", "min", "p25", "median", "p75", "max"], grad_rows, "grad")
        if grad_rows
        else "<p class='muted'>no grad/total_norm (run.watch(model))</p>",
        "<h2>Reward distribution per epoch"
        + (f" ({html.escape(reward_samples)})" if reward_samples else "")
        + "</h2>",
        _table(["epoch", "n", "min", "p25", "median", "p75", "max"], reward_rows, "rewards")
        if reward_rows
        else "<p class='muted'>no per-sample values</p>",
    ]
    page += [
        "<h2>Alerts</h2>",
        _table(["when, step, what"], [[describe_alert(a)] for a in alerts], "alerts")
        if alerts
        else "<p class='muted'>the rules raised no alert on this run</p>",
        "<h2>Per-label breakdown</h2>",
        _labels_table(health.labels)
        if health.labels
        else "<p class='muted'>no labelled events (run.log_episode(..., labels=...))</p>",
    ]
    if others:
        page += [
            "<h2>Comparison</h2>",
            "<p class='muted'>final windows (last tenth), Welch's t-test, Hedges' g; baseline: this run</p>",
            _table(
                ["config key", *[run_id, *others]],
                [[k, *[json.dumps(v.get(r)) for r in (run_id, *others)]] for k, v in diff.items()],
                "config-diff",
            )
            if diff
            else "<p class='muted'>configs are identical</p>",
            _table(
                ["metric", "run", "baseline", "run mean", "p", "g", "verdict"], comparison_rows, "comparison"
            ),
        ]
        if score_rows:
            page += [
                "<h3>Groups across seeds</h3>",
                "<p class='muted'>each group: the mean of its runs at each step with a band of one "
                "sample std either side (runs interpolated onto shared steps); the IQM of its runs' "
                "final-window means with a 95% bootstrap interval, and against the baseline group "
                "Welch's t-test on the runs' means with the 95% interval of the difference of means it "
                "implies: the verdict is decided by that interval</p>",
                "<div id='group-charts'></div>",
                _table(
                    ["metric", "group", "runs", "IQM [95% CI]"]
                    + ["mean vs baseline [95% CI]", "Welch p", "verdict"],
                    score_rows,
                    "group-scores",
                ),
            ]
        if group_rows:
            page += [
                "<h3>Across seeds</h3>",
                "<p class='muted'>runs that differ only in seed keys are one group: "
                + html.escape("; ".join(f"{g}: {', '.join(rs)}" for g, rs in groups.items()))
                + ". Welch's t-test on each run's final-window mean.</p>",
                _table(
                    ["metric", "group", "runs", "baseline group", "group mean", "p", "g", "verdict"],
                    group_rows,
                    "groups",
                ),
            ]
    page += [
        "<h2>Config</h2>",
        "<pre id='config'>" + html.escape(json.dumps(run.config, indent=2, sort_keys=True, default=str)),
        "</pre>",
        "<p class='muted'>charts: uPlot (MIT licence, © Leon Sorokin), inlined</p>",
        f"<script>{_asset('uPlot.iife.min.js')}</script>",
        f"<script>{_asset('plot.js')}</script>",  # the dashboard's axis labels and readouts
        # metric names are untrusted: no "<" survives in the inlined JSON, so none closes the script
        "<script>const DATA = " + json.dumps(data, allow_nan=False).replace("<", "\\u003c") + ";",
        f"{_own('report.js')}</script>",
        "</body></html>",
    ]
    return "\n".join(page)


#: metrics drawn as group bands in a report (the first compared: the role catalog's come first)
_GROUP_CHARTS = 4


def _group_bands(result: Any, runs: dict[str, Any]) -> list[dict[str, Any]]:
    """Each compared metric's groups as mean curves with bands, for the report's full-width charts."""
    from metricbus.diagnostics._groups import bands, curve

    out = []
    for metric in list(dict.fromkeys(sc.metric for sc in result.group_scores))[:_GROUP_CHARTS]:
        curves = {
            r: curve(reading.seen.series[metric].steps, reading.seen.series[metric].values)
            for r, reading in runs.items()
            if metric in reading.seen.series
        }
        drawn = [
            {
                "group": b.group,
                "runs": len(b.runs),
                "steps": b.steps,
                "mean": b.mean,
                "lower": b.lower,
                "upper": b.upper,
            }
            for b in bands(curves, result.groups)
        ]
        out.append({"metric": metric, "bands": json.loads(strict_json(drawn))})  # NaN: null
    return out


def _score_rows(result: Any) -> list[list[Any]]:
    """A row per metric and group: IQM with its interval, and against the baseline group."""
    from metricbus.diagnostics._groups import interval_text as interval

    against = {(c.metric, c.group): c for c in result.group_metrics}
    rows = []
    for sc in result.group_scores:
        c = against.get((sc.metric, sc.group))
        base = "baseline" if sc.group == result.baseline_group else "-"
        rows.append(
            [
                sc.metric,
                sc.group + (" (best)" if sc.best else ""),
                len(sc.runs),
                f"{sc.iqm:.4g}{interval(*sc.interval)}",
                f"{c.mean - c.baseline_mean:+.4g}{interval(*c.interval)}" if c else base,
                f"{c.p_value:.3g}" if c else "-",
                (("REGRESSION: " if c.verdict == "worse" else "") + c.said) if c else "-",
            ]
        )
    return rows


def _media_section(items: Mapping[str, list[dict[str, Any]]], store: MediaStore | None) -> str:
    """A few items of each media name inlined (data: URIs), within MEDIA_INLINE_BYTES in all."""
    import base64

    if not items:
        return "<p class='muted'>no media logged (run.log_image, log_video, log_audio, log_text)</p>"
    if store is None:
        return "<p class='muted'>media logged, but no media store to read them from</p>"
    budget, out = MEDIA_INLINE_BYTES, []
    for name, bodies in sorted(items.items()):
        bodies = sorted(bodies, key=lambda b: b["step"])
        n = len(bodies)
        k = min(n, MEDIA_PER_NAME)
        picks = sorted({round(i * (n - 1) / max(1, k - 1)) for i in range(k)})  # first to last
        cells = []
        for body in (bodies[i] for i in picks):
            try:
                checked_media_type(body)
                data = store.get(body["ref"], body["size"]) if body["size"] <= budget else None
            except (MediaMissing, ValueError) as exc:
                cells.append(f"<figure><p class='muted'>{html.escape(str(exc))}</p></figure>")
                continue
            caption = f"step {body['step']}" + (f": {body['caption']}" if body.get("caption") else "")
            if data is None:
                shown = "<p class='muted'>not inlined: the report's media budget is spent</p>"
            elif body["kind"] == "text":
                text = data.decode("utf-8", "replace")
                shown = f"<pre>{html.escape(text[:4000])}{'…' if len(text) > 4000 else ''}</pre>"
            else:
                uri = f"data:{body['media_type']};base64,{base64.b64encode(data).decode()}"
                tag = "audio controls" if body["kind"] == "audio" else f"img alt='{html.escape(name)}'"
                shown = f"<{tag} src='{uri}'>" + ("</audio>" if body["kind"] == "audio" else "")
            if data is not None:
                budget -= len(data)
            cells.append(f"<figure>{shown}<figcaption>{html.escape(caption)}</figcaption></figure>")
        shown_of = f"{n} logged" + (f", these {len(picks)}" if n > len(picks) else "")
        out.append(
            f"<div class='media' data-media='{html.escape(name)}'><h3>{html.escape(name)} "
            f"<span class='muted'>({shown_of})</span></h3>" + "".join(cells) + "</div>"
        )
    return "\n".join(out)


def _own(name: str) -> str:
    """The report's own stylesheet or script (``report.css``, ``report.js`` beside this module)."""
    return resources.files("metricbus.diagnostics").joinpath(name).read_text()


def _asset(name: str) -> str:
    where = "web/static/" if name == "plot.js" else "web/static/vendor/uplot/"
    return resources.files("metricbus.ops").joinpath(where + name).read_text()


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if not math.isfinite(value) else f"{value:.4g}"
    return html.escape(str(value))


def _table(columns: list[str], rows: list[list[Any]], ident: str) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{_cell(v)}</td>" for v in row) + "</tr>" for row in rows)
    return f"<table id='{ident}'><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _by_label(derived: Mapping[str, Line], reward: str | None) -> dict[str, dict[str, dict[str, Line]]]:
    """The stream's per-label series: key -> chart title -> value -> its points."""
    out: dict[str, dict[str, dict[str, Line]]] = {}
    for name, points in derived.items():
        if not name.startswith("by_"):
            continue
        key, _, rest = name[3:].partition("/")
        value, _, series = rest.partition("/")
        if series == "share":
            title = "share of events"
        elif series == "episode/success_recent_mean":
            title = "success rate"
        elif (
            reward is not None and series == f"{reward}_recent_mean" or series == "episode/reward_recent_mean"
        ):
            title = f"{series[: -len('_recent_mean')]} (recent mean)"
        else:
            continue
        out.setdefault(key, {}).setdefault(title, {})[value] = points
    return out


def _labels_table(rows: list[dict[str, Any]]) -> str:
    columns = sorted({k for row in rows for k in row} - {"label", "events"})
    return _table(
        ["label", "events", *columns],
        [[r["label"], r["events"], *[r.get(c, math.nan) for c in columns]] for r in rows],
        "labels",
    )


def _epoch_table(epochs: dict[int, dict[str, float]]) -> str:
    columns = sorted({k for row in epochs.values() for k in row})
    rows = [[epoch, *[epochs[epoch].get(c, math.nan) for c in columns]] for epoch in sorted(epochs)]
    return _table(["epoch", *columns], rows, "epochs")
