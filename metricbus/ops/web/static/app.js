// metricbus dashboard: one shell, four views, live through server-sent events. No framework.
"use strict";

const main = document.getElementById("main");
const conn = document.getElementById("conn");
const path = location.pathname;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}

function age(seconds) {
  if (seconds == null) return "-";
  if (seconds < 120) return `${Math.round(seconds)}s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)}m`;
  if (seconds < 172800) return `${(seconds / 3600).toFixed(1)}h`;
  return `${Math.round(seconds / 86400)} days`;
}

// the time of day; with the date when it is not today (an archived run's alert, say)
function when(ms) {
  if (ms == null) return "-";
  const d = new Date(ms);
  return d.toDateString() === new Date().toDateString() ? d.toLocaleTimeString() : d.toLocaleString();
}

// an empty table says so (``empty``) instead of showing bare headers
function table(headers, rows, id, empty) {
  if (!rows.length && empty) return el("p", { class: "muted", ...(id ? { id } : {}) }, empty);
  const t = el("table", id ? { id } : {});
  t.append(el("thead", {}, el("tr", {}, ...headers.map((h) => el("th", {}, h)))));
  const body = el("tbody");
  for (const r of rows) body.append(el("tr", {}, ...r.map((c) => (c instanceof Node && c.tagName === "TD" ? c : el("td", {}, c)))));
  t.append(body);
  return el("div", { class: "tablebox" }, t); // a wide table scrolls in its box, never the page
}

function badge(text) {
  return el("span", { class: `state ${text}` }, text);
}

function follow(url, event, handle) {
  const source = new EventSource(url);
  source.addEventListener(event, (e) => {
    conn.textContent = "live";
    conn.className = "conn ok";
    handle(JSON.parse(e.data));
  });
  source.onerror = () => {
    conn.textContent = "reconnecting…";
    conn.className = "conn";
  };
  return source;
}

for (const a of document.querySelectorAll("nav a")) {
  const view = a.dataset.nav;
  if ((view === "runs" && path === "/") || path.startsWith(`/${view}`)) a.classList.add("active");
}

// -- runs, alerts, pipeline: the overview stream ------------------------------------------

function runsView(status) {
  const rows = status.runs.map((r) => [
    el("td", {}, el("a", { href: `/runs/${encodeURIComponent(r.run_id)}` }, r.run_id)),
    r.project,
    r.name,
    el("td", {}, badge(r.state)),
    el("td", { class: "num" }, `${r.ranks.length}/${r.world_size}`),
    r.host,
    el("td", { class: "num" }, r.last_step == null ? "-" : r.last_step),
    el("td", { class: "num" }, r.events_per_s.toFixed(1)),
    el("td", { class: "num" }, age(r.since_last_event_s)),
    el("td", {}, ...r.firing.map((f) => el("span", { class: "state firing" }, f))),
  ]);
  return [
    el("h2", {}, `Runs (${status.runs.length})`),
    table(["run", "project", "name", "state", "ranks", "host", "last step", "events/s", "last event", "firing alerts"], rows, "runs", "No runs yet: log one (the README's quick start) and it appears here."),
  ];
}

// an alert's row: what fired it (step, value, evidence) and how it ended, side by side
function alertsTable(alerts, withRun, id = "alerts") {
  const rows = alerts.map((a) => [
    ...(withRun ? [el("td", {}, el("a", { href: `/runs/${encodeURIComponent(a.run_id)}` }, a.run_id))] : []),
    el("td", {}, badge(a.state)),
    a.severity,
    a.rule,
    a.metric,
    el("td", { class: "num" }, a.fired_step == null ? "-" : a.fired_step, el("div", { class: "muted" }, when(a.fired_ms))),
    el("td", { class: "num" }, alertValue(a.value)),
    el("td", { class: "wrap" }, a.evidence || a.message),
    a.resolution == null
      ? el("td", { class: "muted" }, a.state === "firing" ? "still firing" : "-")
      : el("td", { class: "wrap" }, a.resolved_step == null ? "" : `step ${a.resolved_step}: `, a.resolution, el("div", { class: "muted" }, when(a.resolved_ms))),
  ]);
  const heads = ["state", "severity", "rule", "metric", "fired at step", "value", "evidence", "resolution"];
  return table(withRun ? ["run", ...heads] : heads, rows, id);
}

function alertValue(v) {
  if (v == null) return "-";
  if (typeof v === "string") return v; // NaN, inf
  return Number.isInteger(v) ? String(v) : v.toPrecision(4);
}

function pipelineView(status) {
  const p = status.pipeline || {};
  const groups = (p.groups || []).map((g) => [
    g.group,
    el("td", {}, el("span", { class: `status ${g.status}` }, g.status)),
    el("td", { class: "num" }, g.lag),
    el("td", { class: "num" }, g.lag ? age(g.lag_s) : "-"),
    el("td", { class: "num" }, g.commit_rate.toFixed(1)),
    g.reason,
  ]);
  const dl = p.dead_letters || {};
  const reasons = (dl.reasons || []).map((r) => [el("td", { class: "num" }, r.count), r.reason]);
  const spools = (p.spools || []).map((s) => [s.run_id, el("td", { class: "num" }, s.unsent_bytes), s.live ? "live run" : "run `metricbus sync`"]);
  const catchup = (p.catching_up || []).map((c) => [c.group, el("td", { class: "num" }, c.runs.length), c.runs.slice(0, 5).join(", ") + (c.runs.length > 5 ? ", ..." : "")]);
  return [
    el("h2", {}, "Pipeline"),
    el("p", { class: "muted" }, `Kafka ${status.kafka}; sampled ${when(p.at ? p.at * 1000 : null)}${p.error ? "; " + p.error : ""}`),
    el("h3", {}, "Consumer groups"),
    table(["group", "status", "lag (records)", "lag (age)", "committed/s", "why"], groups, "groups", "no consumer group has committed yet"),
    el("h3", {}, `Dead letters: ${dl.count == null ? "unknown" : dl.count}`),
    table(["count", "reason"], reasons, "deadletters", "none"),
    el("h3", {}, "Local spools with unsent records"),
    table(["run", "unsent bytes", "published by"], spools, "spools", "none: every run's events reached Kafka"),
    el("h3", {}, "Sinks catching up from the archive (left behind by a planned broker restart)"),
    table(["group", "runs left", "runs"], catchup, "catchup", "none"),
    el("p", { class: "muted" }, `Runs read: ${status.board.records} records (${status.board.skipped} unreadable)`),
  ];
}

function overview(render) {
  follow("/api/stream", "status", (status) => main.replaceChildren(...render(status)));
}

// -- one run: live charts ------------------------------------------------------------------

const charts = {}; // series name -> {plot, points, box}
window.mbCharts = charts;
let filterText = "";
// the x axis: the step, minutes since the run started, or the wall clock (kept in the address)
const AXES = { step: "step", relative: "minutes since the run started", wall: "local time" };
let xMode = new URLSearchParams(location.hash.slice(1)).get("x");
if (!(xMode in AXES)) xMode = "step";
let runStartMs = null; // the run's RunStarted, else its first point seen
const xOf = {
  step: (p) => p[0],
  relative: (p) => (p[2] - runStartMs) / 60000,
  wall: (p) => p[2] / 1000,
};

// a smoothing of a series is drawn over it, in its chart (TensorBoard's and W&B's way)
const SMOOTHINGS = ["_ema", "_recent_mean"];
const COLORS = ["#2f6fde", "#e8710a", "#12b5cb", "#9334e6"];

function makePlot(c) {
  if (c.plot) c.plot.destroy();
  const names = [c.name, ...Object.keys(c.overlays)];
  const opts = {
    width: Math.max(300, c.box.clientWidth - 14),
    height: 180,
    scales: { x: { time: xMode === "wall" } },
    legend: { show: names.length > 1, live: false }, // the names only: live values would take a third of the chart
    series: [
      { label: AXES[xMode] },
      ...names.map((n, i) => ({ label: n, stroke: COLORS[i % COLORS.length], width: i ? 2 : 1.5, spanGaps: i > 0, points: { show: (i ? c.overlays[n] : c.points).length < 60 } })),
    ],
    axes: [{}, { size: 60 }],
  };
  c.plot = new uPlot(opts, plotData(c), c.box);
}

// a point is [step, value, ts_ms]; every series of the chart on the union of their x, sorted
function plotData(c) {
  const x = xOf[xMode];
  const lines = [c.points, ...Object.values(c.overlays)].map((pts) => new Map(pts.map((p) => [x(p), p[1]])));
  const xs = [...new Set(lines.flatMap((m) => [...m.keys()]))].sort((a, b) => a - b);
  c.box.dataset.points = String(c.points.length);
  c.box.dataset.overlays = Object.keys(c.overlays).sort().join(" ");
  c.box.dataset.xmin = xs.length ? String(xs[0]) : "";
  c.box.dataset.xmax = xs.length ? String(xs[xs.length - 1]) : "";
  return [xs, ...lines.map((m) => xs.map((v) => (m.has(v) ? m.get(v) : null)))];
}

// the section of a series: the reward and loss first (the alias catalog's roles), then by prefix
function sectionOf(name, roles) {
  if (name === roles.reward || name === roles.loss) return "Reward and loss";
  return name.includes("/") ? name.split("/")[0] : "other";
}

function sectionGrid(sections, title) {
  let s = sections.get(title);
  if (s) return s.grid;
  const grid = el("div", { class: "charts" });
  const box = el("details", { class: "section", open: "", "data-section": title }, el("summary", {}, title), grid);
  s = { box, grid };
  sections.set(title, s);
  const order = [...sections.keys()].sort((a, b) => (a === "Reward and loss" ? -1 : b === "Reward and loss" ? 1 : a.localeCompare(b)));
  sections.container.replaceChildren(...order.map((t) => sections.get(t).box));
  return grid;
}

function chartFor(sections, name, roles) {
  let c = charts[name];
  if (c) return c;
  const box = el("div", { class: "chart", "data-series": name, "data-points": "0" });
  box.append(el("div", { class: "title" }, name));
  sectionGrid(sections, sectionOf(name, roles)).append(box);
  c = charts[name] = { name, box, points: [], overlays: {}, plot: null };
  makePlot(c);
  box.hidden = filterText && !name.toLowerCase().includes(filterText);
  return c;
}

// newer steps only, as the server sends them: a reconnected stream starts over
function extend(points, more, max) {
  const last = points.length ? points[points.length - 1][0] : -Infinity;
  for (const p of more) if (p[0] > last) points.push(p);
  if (points.length > max) points.splice(0, points.length - max);
}

// series that hold one value of the run, not a curve: a summary table, not a chart
const SINGLE = [/^final\//, /_(total|nonfinite)_samples$/];
const isSingle = (name) => SINGLE.some((re) => re.test(name));
const fmt = (v) => (v == null ? "-" : Number.isInteger(v) && Math.abs(v) < 1e15 ? String(v) : Math.abs(v) >= 1e4 || (v !== 0 && Math.abs(v) < 1e-3) ? v.toExponential(3) : v.toFixed(4));

function runView(runId) {
  const head = el("h2", {}, `Run ${runId}`);
  const facts = el("p", { class: "muted", id: "facts" });
  const tensorboard = el("span", { id: "tensorboard" });
  const links = el("p", { class: "muted", id: "links" },
    el("a", { href: `/runs/${encodeURIComponent(runId)}/report`, target: "_blank" }, "report"),
    " (every chart, health and the alert timeline, from the archive; `metricbus report ", runId, "` writes it to a file) · ", tensorboard);
  const filter = el("input", { class: "filter", placeholder: "filter series (e.g. Train/, Epoch/)" });
  const axis = el("select", { id: "xaxis" }, ...Object.entries(AXES).map(([v, label]) => el("option", { value: v }, label)));
  axis.value = xMode;
  axis.addEventListener("change", () => {
    xMode = axis.value;
    history.replaceState(null, "", "#x=" + xMode);
    document.body.dataset.xaxis = xMode;
    for (const c of Object.values(charts)) makePlot(c);
  });
  document.body.dataset.xaxis = xMode;
  const grid = el("div", { id: "charts" });
  const sections = new Map();
  sections.container = grid;
  const epochs = el("div", { id: "epochs" }, el("p", { class: "muted" }, "loading…"));
  const alerts = el("div", { id: "run-alerts" }, el("p", { class: "muted" }, "loading…"));
  const firing = el("div", { id: "firing" }, el("p", { class: "muted" }, "loading…"));
  const summary = el("div", { id: "summary" }, el("p", { class: "muted" }, "loading…"));
  const config = el("pre", { id: "config" }, "loading…");
  const health = el("div", { id: "health" });
  const media = el("div", { id: "media" }, el("p", { class: "muted", id: "media-none" }, "no media logged (run.log_image, log_video, log_audio, log_text)"));
  const mediaShown = {}; // name -> its panel, kept across updates (the slider where the user left it)
  // on top: health and what fires now; then the reward and loss charts (the first section)
  const top = el("div", { class: "top" }, el("div", {}, el("h3", {}, "Health"), health), el("div", {}, el("h3", {}, "Firing alerts"), firing));
  main.replaceChildren(head, facts, links, top, el("h3", {}, "Series"), el("p", {}, filter, " x axis ", axis), grid, el("h3", {}, "Media"), media, el("h3", {}, "Summary"), summary, el("h3", {}, "All alerts"), alerts, el("h3", {}, "Epochs"), epochs, el("h3", {}, "Config"), config);
  showHealth(runId, health);
  setInterval(() => showHealth(runId, health), 15000);
  const shown = (c) => !c.single && !(filterText && !c.name.toLowerCase().includes(filterText));
  filter.addEventListener("input", () => {
    filterText = filter.value.toLowerCase();
    for (const c of Object.values(charts)) c.box.hidden = !shown(c);
  });
  window.addEventListener("resize", () => {
    for (const c of Object.values(charts)) c.plot.setSize({ width: Math.max(300, c.box.clientWidth - 14), height: 180 });
  });
  const singles = {}; // name -> its last point, for the summary table
  follow(`/api/runs/${encodeURIComponent(runId)}/stream`, "run", (run) => {
    document.title = `${run.name} · metricbus`;
    const nFiring = run.alerts.filter((a) => a.state === "firing").length;
    facts.replaceChildren(
      badge(run.state),
      ` project ${run.project} · name ${run.name}${run.host ? ` · host ${run.host}` : ""} · ranks ${run.ranks.length}/${run.world_size} · last step ${run.last_step ?? "-"} · ${run.events_per_s.toFixed(1)} events/s · last event ${age(run.since_last_event_s)} ago · `,
      nFiring ? badge(`${nFiring} firing`) : "no alert firing",
    );
    if (run.tensorboard && run.tensorboard.length) {
      const dir = run.tensorboard[0];
      tensorboard.replaceChildren("TensorBoard: ", el("code", { id: "tensorboard-cmd" }, `tensorboard --logdir ${dir.slice(0, dir.lastIndexOf("/"))}`), ` (this run: ${dir.slice(dir.lastIndexOf("/") + 1)})`);
    } else if (!tensorboard.firstChild) tensorboard.replaceChildren("TensorBoard: not written yet (no TensorBoard sink, or it has not reached this run)");
    const first = Math.min(...Object.values(run.series).flatMap((ps) => (ps.length ? [ps[0][2]] : [])));
    const start = run.started_ms ?? Math.min(runStartMs ?? Infinity, first);
    if (Number.isFinite(start) && start !== runStartMs) {
      runStartMs = start;
      if (xMode === "relative") for (const c of Object.values(charts)) c.plot.setData(plotData(c));
    }
    const roles = run.roles || {};
    const names = new Set([...Object.keys(run.series), ...Object.keys(charts)]);
    const touched = new Set();
    for (const [name, points] of Object.entries(run.series)) {
      if (isSingle(name)) {
        if (points.length) singles[name] = points[points.length - 1];
        continue;
      }
      const suffix = SMOOTHINGS.find((x) => name.endsWith(x) && names.has(name.slice(0, -x.length)));
      if (suffix) {
        const c = chartFor(sections, name.slice(0, -suffix.length), roles);
        const fresh = !(name in c.overlays);
        extend((c.overlays[name] ??= []), points, run.max_points);
        if (fresh) makePlot(c);
        touched.add(c);
      } else {
        const c = chartFor(sections, name, roles);
        // as many as the server keeps: a page left open for a week holds no more than a fresh one
        extend(c.points, points, run.max_points);
        touched.add(c);
      }
    }
    for (const c of touched) c.plot.setData(plotData(c));
    // a finished run's series of one point is one value: in the summary, not a chart of a dot
    for (const c of Object.values(charts)) {
      c.single = Boolean(run.finished) && c.points.length === 1 && !Object.keys(c.overlays).length;
      if (c.single) singles[c.name] = c.points[0];
      c.box.hidden = !shown(c);
    }
    for (const s of sections.values()) s.box.hidden = ![...s.grid.children].some((b) => !charts[b.dataset.series].single);
    const rows = [
      ...Object.entries(run.summary || {}).map(([k, v]) => [k, el("td", { class: "num" }, fmt(v)), "run summary"]),
      ...Object.entries(singles).sort(([a], [b]) => a.localeCompare(b)).map(([k, p]) => [k, el("td", { class: "num" }, fmt(p[1])), `step ${p[0]}`]),
    ];
    summary.replaceChildren(rows.length ? table(["name", "value", "at"], rows, "summary-table") : el("p", { class: "muted" }, "no single values yet (final/* series, the run's finish(summary=...))"));
    const now = run.alerts.filter((a) => a.state === "firing");
    firing.replaceChildren(now.length ? alertsTable(now, false, "firing-alerts") : el("p", { class: "muted" }, run.finished ? "none: the run is finished" : "none"));
    alerts.replaceChildren(
      ...(run.archived
        ? [el("p", { class: "muted", id: "archived-note" }, `Drawn from the archive: the topics no longer hold this run. Its alerts are the stack's rules run over its archived events (\`metricbus backtest ${run.run_id}\`).`)]
        : []),
      run.alerts.length ? alertsTable(run.alerts, false) : el("p", { class: "muted" }, "no alerts"),
    );
    const cols = [...new Set(run.epochs.flatMap((e) => Object.keys(e).filter((k) => k !== "epoch")))].sort();
    epochs.replaceChildren(run.epochs.length ? table(["epoch", ...cols], run.epochs.map((e) => [e.epoch, ...cols.map((k) => el("td", { class: "num" }, fmt(e[k])))]), "epochs-table") : el("p", { class: "muted" }, "no epochs yet"));
    config.textContent = JSON.stringify(run.config, null, 2);
    if (run.media && Object.keys(run.media).length) showMedia(media, mediaShown, run.media);
  });
}

// a panel per media name: the item at the chosen step (a slider over the steps that have one)
function showMedia(box, shown, media) {
  box.classList.add("media-grid");
  for (const [name, items] of Object.entries(media)) {
    let p = shown[name];
    if (!p) {
      const slider = el("input", { type: "range", min: "0", step: "1", class: "media-step", "aria-label": `${name}: step` });
      p = shown[name] = { slider, label: el("span", { class: "muted media-at" }), view: el("div", { class: "media-view" }), caption: el("p", { class: "muted media-caption" }), items: [], at: -1 };
      p.box = el("div", { class: "media-panel", "data-media": name }, el("h4", {}, name), p.view, p.caption, el("p", {}, "step ", slider, " ", p.label));
      slider.addEventListener("input", () => drawMediaItem(p, Number(slider.value)));
      box.append(p.box);
    }
    const following = p.at < 0 || p.at === p.items.length - 1; // at the latest: stay there
    const current = p.items[p.at];
    p.items = items;
    p.slider.max = String(items.length - 1);
    const at = following ? items.length - 1 : Math.max(0, items.findIndex((i) => current && i.digest === current.digest && i.step === current.step));
    p.slider.value = String(at);
    drawMediaItem(p, at);
  }
  box.querySelector("#media-none")?.remove();
}

function drawMediaItem(p, at) {
  const item = p.items[at];
  if (!item) return;
  p.label.textContent = `${item.step} (${at + 1} of ${p.items.length})`;
  p.caption.textContent = item.caption || "";
  if (p.at === at && p.shownDigest === item.digest) return;
  p.at = at;
  p.shownDigest = item.digest;
  const src = `/api/media/${item.digest}?kind=${item.kind}`;
  if (item.kind === "audio") p.view.replaceChildren(el("audio", { controls: "", src }));
  else if (item.kind === "text") {
    const pre = el("pre", { class: "media-text" }, "loading…");
    p.view.replaceChildren(pre);
    fetch(src).then((r) => (r.ok ? r.text() : `not in the media store (${r.status})`)).then((t) => { pre.textContent = t; });
  } else p.view.replaceChildren(el("img", { src, alt: `${p.box.dataset.media} at step ${item.step}` }));
}

// the run's health from the archive (metricbus health), refreshed every 15 s
async function showHealth(runId, box) {
  if (!box.firstChild) box.replaceChildren(el("p", { class: "muted" }, "computing the run's health from the archive…"));
  let h;
  try {
    const r = await fetch(`/api/runs/${encodeURIComponent(runId)}/health`);
    h = await r.json();
    if (!r.ok) return box.replaceChildren(el("p", { class: "muted" }, h.error || "no health yet"));
  } catch (e) {
    return;
  }
  const parts = h.parts.map((p) => [p.name, el("td", { class: "num" }, `-${p.deducted.toFixed(1)} of ${p.weight}`), el("td", { class: "wrap" }, p.evidence.join("; ") || "-")]);
  const labels = (h.labels || []).map((r) => [r.label, el("td", { class: "num" }, r.events), Object.entries(r).filter(([k]) => k !== "label" && k !== "events").map(([k, v]) => `${k} ${v.toPrecision(4)}`).join(", ")]);
  const worst = h.parts.filter((p) => p.deducted > 0).sort((a, b) => b.deducted - a.deducted)[0];
  box.replaceChildren(
    el("p", { class: "score", id: "health-score" }, `${Math.round(h.score)}/100`),
    el("p", { class: "muted" }, worst ? `most deducted: ${worst.name} (${worst.evidence[0] || "-"})` : "nothing deducted"),
    el("details", { id: "health-details" }, el("summary", {}, "every part and its evidence"),
      table(["part", "deducted", "evidence"], parts, "health-parts"),
      ...(labels.length ? [table(["label", "events", "final-window means"], labels, "health-labels")] : [])),
  );
}

// -- experiments: the archive's runs in a table; chosen runs compared and grouped ----------

const GROUP_COLORS = ["#2f6fde", "#e8710a", "#12b5cb", "#9334e6", "#1e8e3e", "#d93025", "#f9ab00", "#5f6368"];
const ALPHA = (hex, a) => hex + Math.round(a * 255).toString(16).padStart(2, "0");

// TensorBoard's smoothing: an exponential moving average, debiased at the start
function smooth(values, weight) {
  if (!weight) return values;
  let last = 0, n = 0;
  return values.map((v) => {
    if (v == null) return null;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return last / (1 - Math.pow(weight, n));
  });
}

function experimentsView() {
  // what the page shows is kept in its address (a link shows the same) and, without one, the last view
  const saved = location.hash.length > 1 ? location.hash.slice(1) : localStorage.getItem("mb-experiments") || "";
  const q = new URLSearchParams(saved);
  const st = {
    project: q.get("project") || "",
    filter: q.get("filter") || "",
    sort: q.get("sort") || "started",
    desc: q.get("desc") === "1",
    runs: new Set((q.get("runs") || "").split(",").filter(Boolean)),
    metric: q.get("metric") || "",
    group: q.has("group") ? q.get("group").split(",").filter(Boolean) : null, // null: the keys that differ
    band: q.get("band") || "std",
    smooth: Number(q.get("smooth") || 0),
    baseline: q.get("baseline") || "",
    cols: q.has("cols") ? q.get("cols").split(",").filter(Boolean) : null, // null: the keys that differ
  };
  const remember = () => {
    const out = new URLSearchParams();
    for (const k of ["project", "filter", "sort", "metric", "band", "baseline"]) if (st[k]) out.set(k, st[k]);
    if (st.desc) out.set("desc", "1");
    if (st.smooth) out.set("smooth", String(st.smooth));
    if (st.runs.size) out.set("runs", [...st.runs].join(","));
    if (st.group) out.set("group", st.group.join(","));
    if (st.cols) out.set("cols", st.cols.join(","));
    history.replaceState(null, "", "#" + out.toString());
    localStorage.setItem("mb-experiments", out.toString());
  };
  let data = { runs: [], keys: [], differ: [], projects: [] };
  const project = el("select", { id: "project" });
  const filter = el("input", { class: "filter", id: "runs-filter", placeholder: "filter runs (name, id, config value)", value: st.filter });
  const colsBox = el("details", { id: "columns" });
  const tableBox = el("div", { id: "runs-table" }, el("p", { class: "muted" }, "reading the archive…"));
  const picked = el("p", { class: "muted", id: "picked" });
  const metric = el("select", { id: "metric" });
  const groupBox = el("span", { id: "group-by" });
  const band = el("select", { id: "band" }, el("option", { value: "std" }, "mean ± std"), el("option", { value: "minmax" }, "min to max"));
  band.value = st.band;
  const smoothing = el("input", { type: "range", min: "0", max: "0.99", step: "0.01", id: "smoothing" });
  smoothing.value = String(st.smooth);
  const smoothLabel = el("span", { class: "muted" }, st.smooth.toFixed(2));
  const baseline = el("select", { id: "baseline" });
  const chartBox = el("div", { class: "chart", id: "group-chart", "data-groups": "0", "data-bands": "0" });
  const stats = el("div", { id: "group-stats" });
  main.replaceChildren(
    el("h2", {}, "Experiments"),
    el("p", { class: "muted" }, "Every run in the archive. Tick runs (or a whole project), pick a metric, and group by config keys: each group is the mean of its runs with a band, and the IQM of the runs' final-window means with a 95% bootstrap interval, tested against a baseline group (what `metricbus compare --group-by` says)."),
    el("p", {}, "project ", project, " ", filter, " ", colsBox),
    tableBox,
    picked,
    el("h3", {}, "Compare"),
    el("p", {}, "metric ", metric, " group by ", groupBox, " band ", band, " smoothing ", smoothing, " ", smoothLabel, " baseline ", baseline),
    chartBox,
    stats,
  );
  const shownRuns = () => {
    const f = st.filter.toLowerCase();
    const rows = data.runs.filter((r) => !f || [r.name, r.run_id, r.state, ...Object.entries(r.config).map(([k, v]) => `${k}=${v}`)].some((t) => String(t).toLowerCase().includes(f)));
    const key = st.sort;
    const val = (r) => (key.startsWith("config/") ? r.config[key.slice(7)] : key.startsWith("summary/") ? r.summary[key.slice(8)] : key === "started" ? r.started_ms : r[key]);
    rows.sort((a, b) => {
      const x = val(a), y = val(b);
      const c = x == null ? 1 : y == null ? -1 : typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
      return st.desc ? -c : c;
    });
    return rows;
  };
  const drawTable = () => {
    const cols = st.cols || data.differ;
    const summaryKeys = [...new Set(data.runs.flatMap((r) => Object.keys(r.summary)))].sort();
    const rows = shownRuns();
    const all = el("input", { type: "checkbox", id: "select-shown", title: "select every run shown" });
    all.checked = rows.length > 0 && rows.every((r) => st.runs.has(r.run_id));
    all.addEventListener("change", () => {
      for (const r of rows) all.checked ? st.runs.add(r.run_id) : st.runs.delete(r.run_id);
      changed(true);
    });
    const heads = [["name", "name"], ["run", "run_id"], ["state", "state"], ["last step", "last_step"], ["started", "started"], ...cols.map((k) => [k, "config/" + k]), ...summaryKeys.map((k) => [k, "summary/" + k])];
    const t = el("table", { id: "runs" });
    const tr = el("tr", {}, el("th", {}, all));
    for (const [label, key] of heads) {
      const th = el("th", { class: "sortable", "data-sort": key }, label + (st.sort === key ? (st.desc ? " ▼" : " ▲") : ""));
      th.addEventListener("click", () => {
        st.desc = st.sort === key ? !st.desc : false;
        st.sort = key;
        remember();
        drawTable();
      });
      tr.append(th);
    }
    t.append(el("thead", {}, tr));
    const body = el("tbody");
    for (const r of rows) {
      const box = el("input", { type: "checkbox", "data-run": r.run_id });
      box.checked = st.runs.has(r.run_id);
      box.addEventListener("change", () => {
        box.checked ? st.runs.add(r.run_id) : st.runs.delete(r.run_id);
        changed(true);
      });
      body.append(el("tr", { "data-run": r.run_id },
        el("td", {}, box),
        el("td", {}, r.name),
        el("td", {}, el("a", { href: `/runs/${encodeURIComponent(r.run_id)}` }, r.run_id)),
        el("td", {}, badge(r.state === "running or crashed" ? "live" : r.state)),
        el("td", { class: "num" }, r.last_step ?? "-"),
        el("td", {}, r.started_ms == null ? "-" : new Date(r.started_ms).toLocaleString()),
        ...cols.map((k) => el("td", { class: "num" }, r.config[k] ?? "-")),
        ...summaryKeys.map((k) => el("td", { class: "num" }, typeof r.summary[k] === "number" ? fmt(r.summary[k]) : r.summary[k] ?? "-")),
      ));
    }
    t.append(body);
    tableBox.replaceChildren(rows.length ? el("div", { class: "tablebox" }, t) : el("p", { class: "muted" }, data.runs.length ? "no run matches the filter" : "No runs in the archive yet: run `make demo`, or log one (the README's quick start)."));
    tableBox.dataset.rows = String(rows.length);
    picked.textContent = `${rows.length} of ${data.runs.length} runs shown; ${st.runs.size} selected`;
  };
  const drawColumns = () => {
    const cols = st.cols || data.differ;
    const boxes = data.keys.map((k) => {
      const b = el("input", { type: "checkbox", "data-col": k });
      b.checked = cols.includes(k);
      b.addEventListener("change", () => {
        st.cols = [...colsBox.querySelectorAll("input:checked")].map((x) => x.dataset.col);
        remember();
        drawTable();
      });
      return el("label", {}, b, ` ${k} `);
    });
    colsBox.replaceChildren(el("summary", {}, "config columns"), ...(boxes.length ? boxes : [el("span", { class: "muted" }, "no config logged")]));
  };
  const drawGroupBy = () => {
    const chosen = st.group || data.differ;
    const keys = [...data.differ, ...data.keys.filter((k) => !data.differ.includes(k))];
    groupBox.replaceChildren(...(keys.length ? keys.map((k) => {
      const b = el("input", { type: "checkbox", "data-key": k });
      b.checked = chosen.includes(k);
      b.addEventListener("change", () => {
        st.group = [...groupBox.querySelectorAll("input:checked")].map((x) => x.dataset.key);
        st.baseline = "";
        remember();
        drawChart();
      });
      return el("label", {}, b, ` ${k} `);
    }) : [el("span", { class: "muted" }, "no config keys")]));
  };
  let metricsFor = "";
  async function loadMetrics() {
    const runs = [...st.runs].join(",");
    if (!runs || runs === metricsFor) return;
    metricsFor = runs;
    const r = await fetch(`/api/experiments/metrics?runs=${encodeURIComponent(runs)}`);
    const names = r.ok ? (await r.json()).metrics : [];
    metric.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
    if (!names.includes(st.metric)) st.metric = names.find((n) => /reward|return/i.test(n)) || names[0] || "";
    metric.value = st.metric;
  }
  let plot = null, asked = 0;
  async function drawChart() {
    const ask = ++asked;
    if (st.runs.size < 1) {
      if (plot) plot.destroy(), (plot = null);
      chartBox.replaceChildren(el("p", { class: "muted" }, "Tick runs in the table to compare them."));
      chartBox.dataset.groups = chartBox.dataset.bands = "0";
      stats.replaceChildren();
      return;
    }
    await loadMetrics();
    if (!st.metric) return;
    const params = new URLSearchParams({ runs: [...st.runs].join(","), metric: st.metric, band: st.band });
    if (st.group) params.set("group_by", st.group.join(","));
    if (st.baseline) params.set("baseline", st.baseline);
    chartBox.dataset.loading = "1";
    const r = await fetch(`/api/experiments/chart?${params}`);
    const chart = await r.json();
    if (ask !== asked) return; // a newer choice is being drawn
    delete chartBox.dataset.loading;
    if (!r.ok) return chartBox.replaceChildren(el("p", { class: "muted" }, chart.error || "cannot draw"));
    render(chart);
  }
  // the chart drawn from what the server sent: smoothing is the page's own, no new request
  function render(chart) {
    const bands = chart.bands;
    const xs = [...new Set(bands.flatMap((b) => b.steps))].sort((a, b) => a - b);
    const at = (b, ys) => { const m = new Map(b.steps.map((s, i) => [s, ys[i]])); return xs.map((x) => (m.has(x) ? m.get(x) : null)); };
    const series = [{ label: "step" }], values = [xs], fills = [];
    bands.forEach((b, i) => {
      const color = GROUP_COLORS[i % GROUP_COLORS.length];
      values.push(smooth(at(b, b.mean), st.smooth));
      series.push({ label: `${b.group} (${b.runs.length})`, stroke: color, width: 2, spanGaps: true, points: { show: false } });
      if (b.runs.length > 1) {
        values.push(smooth(at(b, b.upper), st.smooth), smooth(at(b, b.lower), st.smooth));
        const edge = { stroke: ALPHA(color, 0.3), width: 1, spanGaps: true, points: { show: false } };
        series.push({ ...edge, label: `${b.group} upper` }, { ...edge, label: `${b.group} lower` });
        fills.push({ series: [values.length - 2, values.length - 1], fill: ALPHA(color, 0.15) });
      }
    });
    if (plot) plot.destroy();
    const grouped = chart.scores.length > 0;
    chartBox.replaceChildren(el("div", { class: "title" }, `${chart.metric}: ${grouped ? `${bands.length} group(s), ${st.band === "std" ? "mean ± std" : "mean, min to max"}` : "each run"}`));
    plot = new uPlot({ width: Math.max(400, chartBox.clientWidth - 14), height: 320, series, bands: fills, legend: { show: false }, axes: [{}, { size: 60 }], scales: { x: { time: false } } }, values, chartBox);
    // the legend: one entry a group (its band's edges are not series of their own to a reader)
    chartBox.append(el("div", { class: "legend", id: "group-legend" }, ...bands.map((b, i) => el("span", {}, el("i", { style: `background:${GROUP_COLORS[i % GROUP_COLORS.length]}` }), `${b.group} (${b.runs.length} run${b.runs.length > 1 ? "s" : ""})`))));
    chartBox.dataset.groups = String(bands.length);
    chartBox.dataset.bands = String(fills.length);
    window.mbExperiment = chart;
    baseline.replaceChildren(...(chart.scores.length ? Object.keys(chart.groups) : []).map((g) => el("option", { value: g }, g)));
    baseline.disabled = !chart.scores.length; // no groups, no baseline
    if (chart.baseline_group) baseline.value = chart.baseline_group;
    drawStats(chart);
  }
  const interval = (iv) => (iv && iv[0] != null ? ` [${fmt(iv[0])}, ${fmt(iv[1])}]` : "");
  function drawStats(chart) {
    if (!chart.scores.length) return stats.replaceChildren(el("p", { class: "muted" }, "Group by a config key to see each group's statistics (one run a group says nothing about spread)."));
    const against = new Map(chart.compared.map((c) => [c.group, c]));
    const dir = chart.scores[0].higher_is_better ? "higher" : "lower";
    const rows = chart.scores.map((s) => {
      const c = against.get(s.group);
      return [
        el("td", {}, s.group, s.best ? el("span", { class: "state live best" }, "best") : ""),
        el("td", { class: "num" }, s.runs.length),
        el("td", { class: "num" }, fmt(s.iqm) + interval(s.interval)),
        el("td", { class: "num" }, s.std == null ? "-" : fmt(s.std)),
        el("td", { class: "num" }, c ? fmt(c.iqm - c.baseline_iqm) + interval(c.difference_interval) : s.group === chart.baseline_group ? "baseline" : "-"),
        el("td", { class: "num" }, c ? c.p_value.toPrecision(3) : "-"),
        el("td", {}, c ? badge(c.verdict === "worse" ? "REGRESSION" : c.verdict === "better" ? "better" : "no significant change") : "-"),
      ];
    });
    const diff = Object.entries(chart.config_diff || {}).map(([k, vs]) => [k, [...new Set(Object.values(vs).map((v) => JSON.stringify(v)))].join(", ")]);
    stats.replaceChildren(
      el("p", { class: "muted" }, `${chart.metric}: ${dir} is better. Each run's final window (its last tenth, at least 5 values) is one value; each group's IQM of them with a 95% bootstrap interval, and against the baseline the difference of IQMs with its interval and Welch's t-test on the runs' values.`),
      table(["group", "runs", "IQM [95% CI]", "std of runs", "vs baseline [95% CI]", "Welch p", "verdict"], rows, "group-table"),
      el("h3", {}, "Config keys that differ"),
      table(["key", "values"], diff, "config-diff", "the configs are the same"),
    );
  }
  const changed = (runsChanged) => {
    remember();
    drawTable();
    if (runsChanged) drawChart();
  };
  project.addEventListener("change", async () => {
    st.project = project.value;
    st.cols = null;
    st.group = null;
    await load();
    st.runs = new Set(data.runs.map((r) => r.run_id)); // a project chosen: its runs
    changed(true);
  });
  filter.addEventListener("input", () => {
    st.filter = filter.value;
    changed(false);
  });
  metric.addEventListener("change", () => { st.metric = metric.value; remember(); drawChart(); });
  band.addEventListener("change", () => { st.band = band.value; remember(); drawChart(); });
  baseline.addEventListener("change", () => { st.baseline = baseline.value; remember(); drawChart(); });
  smoothing.addEventListener("input", () => { st.smooth = Number(smoothing.value); smoothLabel.textContent = st.smooth.toFixed(2); remember(); if (window.mbExperiment) render(window.mbExperiment); });
  window.addEventListener("resize", () => plot && plot.setSize({ width: Math.max(400, chartBox.clientWidth - 14), height: 320 }));
  async function load() {
    const r = await fetch(`/api/experiments${st.project ? `?project=${encodeURIComponent(st.project)}` : ""}`);
    data = await r.json();
    project.replaceChildren(el("option", { value: "" }, "every project"), ...data.projects.map((p) => el("option", { value: p }, p)));
    project.value = st.project;
    const known = new Set(data.runs.map((r) => r.run_id));
    st.runs = new Set([...st.runs].filter((r) => known.has(r)));
    drawColumns();
    drawGroupBy();
    drawTable();
  }
  load().then(() => {
    conn.textContent = "archive";
    conn.className = "conn ok";
    drawChart();
  });
}

if (path.startsWith("/runs/")) runView(decodeURIComponent(path.slice("/runs/".length)));
else if (path === "/alerts")
  overview((s) => [
    el("h2", {}, "Alerts"),
    el("p", { class: "muted" }, "Live runs' alerts from the alerts topic; earlier runs' from the archive (the stack's rules over their events, as `metricbus backtest` shows them)."),
    ...(s.alerts_pending ? [el("p", { class: "muted", id: "alerts-pending" }, `Still reading the archive: the alerts of ${s.alerts_pending} earlier runs are not shown yet.`)] : []),
    s.alerts.length ? alertsTable(s.alerts, true) : el("p", { class: "muted", id: "alerts" }, "No alerts raised on any run."),
  ]);
else if (path === "/pipeline") overview(pipelineView);
else if (path === "/experiments") experimentsView();
else overview(runsView);
