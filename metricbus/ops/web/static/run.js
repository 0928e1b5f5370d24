// -- one run: live charts ------------------------------------------------------------------

const charts = {}; // series name -> its chart: {name, box, points, plot, log, kind}
window.mbCharts = charts;
let filterText = "";
// the x axis: the step, minutes since the run started, or the wall clock; the smoothing weight
// (TensorBoard's slider): both kept in the address
const AXES = { step: "step", relative: "minutes since the run started", wall: "local time" };
const runHash = new URLSearchParams(location.hash.slice(1));
let xMode = runHash.get("x");
if (!(xMode in AXES)) xMode = "step";
let smoothing = runHash.has("smooth") ? Math.min(0.99, Math.max(0, Number(runHash.get("smooth")) || 0)) : 0.6;
let runStartMs = null; // the run's RunStarted, else its first point seen
const xOf = {
  step: (p) => p[0],
  relative: (p) => (p[2] - runStartMs) / 60000,
  wall: (p) => p[2] / 1000,
};
const RAW = "#2f6fde";
const FAINT = "rgba(47, 111, 222, 0.28)";
const SMOOTHED = "#1a4fb4";

// the server's own smoothings of a logged series: kept in the sinks and the archive, not drawn
// (the page smooths every series itself, at the weight the slider says)
const SMOOTHINGS = ["_ema", "_recent_mean"];
// series that hold one value of the run, not a curve: a summary table, not a chart
const SINGLE = [/^final\//, /_(total|nonfinite)_samples$/];
const isSingle = (name) => SINGLE.some((re) => re.test(name));
// states, not quantities (converged or not, improving/stable/declining): the epochs table's columns
const STATE = [/Converged$/, /TrendClass$/, /_trend$/];
const isState = (name) => STATE.some((re) => re.test(name));

function remember() {
  const h = new URLSearchParams();
  if (xMode !== "step") h.set("x", xMode);
  if (smoothing !== 0.6) h.set("smooth", String(smoothing));
  history.replaceState(null, "", h.toString() ? "#" + h : location.pathname);
}

// the chart's points in x order, and its columns for uPlot: x, raw values, smoothed values
function plotData(c) {
  const x = xOf[xMode];
  c.sorted = c.points.map((p) => [x(p), p]).sort((a, b) => a[0] - b[0]).map((e) => e[1]);
  const xs = c.sorted.map(x);
  const ys = c.sorted.map((p) => p[1]);
  c.box.dataset.points = String(c.points.length);
  c.box.dataset.xmin = xs.length ? String(xs[0]) : "";
  c.box.dataset.xmax = xs.length ? String(xs[xs.length - 1]) : "";
  return [xs, ys, mbPlot.smooth(ys, smoothing)];
}

function describePoint(c) {
  return (u, idx) => {
    const p = c.sorted && c.sorted[idx];
    if (!p) return null;
    const rows = [["value", RAW, mbPlot.value(p[1])]];
    if (smoothing) rows.push([`smoothed (${smoothing.toFixed(2)})`, SMOOTHED, mbPlot.value(u.data[2][idx])]);
    return { title: `step ${p[0]} · ${new Date(p[2]).toLocaleString()}`, rows };
  };
}

function makePlot(c) {
  if (c.plot) c.plot.destroy();
  const data = plotData(c);
  const canLog = mbPlot.logable(data[1]);
  if (!canLog) c.log = false;
  c.logButton.disabled = !canLog;
  c.logButton.title = canLog ? "a log scale for the y axis" : "no log scale: the values reach 0 or below";
  c.logButton.classList.toggle("on", c.log);
  const opts = {
    width: Math.max(300, c.box.clientWidth - 14),
    height: 180,
    scales: { x: { time: xMode === "wall" }, y: c.log ? { distr: 3, log: 10 } : {} },
    legend: { show: false }, // the readout says each value under the pointer
    cursor: { sync: { key: "run" } },
    series: [
      { label: AXES[xMode] },
      { label: "value", stroke: smoothing ? FAINT : RAW, width: smoothing ? 1 : 1.5 },
      { label: "smoothed", stroke: SMOOTHED, width: 1.75, show: smoothing > 0, spanGaps: true, points: { show: false } },
    ],
    axes: [{}, mbPlot.yAxis()],
    plugins: [mbPlot.readout(describePoint(c))],
  };
  c.plot = new uPlot(opts, data, c.plotBox);
}

// the section of a series: the reward and loss first (the alias catalog's roles), then by prefix
function sectionOf(name, roles, derived) {
  if (name === roles.reward || name === roles.loss) return "Reward and loss";
  const prefix = name.includes("/") ? name.split("/")[0] : "other";
  return derived ? `Derived: ${prefix}` : prefix;
}

// sections in order: reward and loss, what the run logged, then what the worker derived (closed)
function sectionGrid(sections, title) {
  let s = sections.get(title);
  if (s) return s.grid;
  const grid = el("div", { class: "charts" });
  const derived = title.startsWith("Derived: ");
  const box = el("details", { class: "section", "data-section": title, ...(derived ? {} : { open: "" }) }, el("summary", {}, title), grid);
  s = { box, grid, derived };
  sections.set(title, s);
  const rank = (t) => (t === "Reward and loss" ? 0 : sections.get(t).derived ? 2 : 1);
  const order = [...sections.keys()].sort((a, b) => rank(a) - rank(b) || a.localeCompare(b));
  sections.container.replaceChildren(...order.map((t) => sections.get(t).box));
  return grid;
}

function chartFor(sections, name, roles, derived, runId) {
  let c = charts[name];
  if (c) return c;
  const box = el("div", { class: "chart", "data-series": name, "data-points": "0" });
  const logButton = el("button", { class: "tool log", type: "button" }, "log");
  const csv = el("a", { class: "tool csv", href: `/api/runs/${encodeURIComponent(runId)}/series.csv?name=${encodeURIComponent(name)}`, download: "", title: "every point of this series in the archive, as CSV" }, "CSV");
  const png = el("button", { class: "tool png", type: "button", title: "this chart as a PNG image" }, "PNG");
  const plotBox = el("div", { class: "plot" });
  box.append(el("div", { class: "chart-head" }, el("span", { class: "title" }, name), el("span", { class: "tools" }, logButton, csv, png)), plotBox);
  sectionGrid(sections, sectionOf(name, roles, derived)).append(box);
  c = charts[name] = { name, box, plotBox, logButton, points: [], plot: null, log: false };
  logButton.addEventListener("click", () => {
    c.log = !c.log;
    makePlot(c);
  });
  png.addEventListener("click", () => mbPlot.png(c.plot, `${name} · run ${runId}`, mbPlot.fileName(name, "png")));
  makePlot(c);
  return c;
}

// newer steps only, as the server sends them: a reconnected stream starts over
function extend(points, more, max) {
  const last = points.length ? points[points.length - 1][0] : -Infinity;
  const before = points.length;
  for (const p of more) if (p[0] > last) points.push(p);
  const added = points.length - before;
  if (points.length > max) points.splice(0, points.length - max);
  return added;
}

// whether a series' points hold one value only (a constant is a table row, not a chart)
function constantOf(points) {
  let v;
  for (const p of points) {
    if (p[1] == null) continue;
    if (v === undefined) v = p[1];
    else if (p[1] !== v) return undefined;
  }
  return v;
}

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
  const slider = el("input", { type: "range", min: "0", max: "0.99", step: "0.01", id: "run-smoothing", "aria-label": "smoothing" });
  slider.value = String(smoothing);
  const sliderLabel = el("span", { class: "muted", id: "run-smoothing-value" }, smoothing.toFixed(2));
  const redraw = () => {
    for (const c of Object.values(charts)) makePlot(c);
  };
  axis.addEventListener("change", () => {
    xMode = axis.value;
    document.body.dataset.xaxis = xMode;
    remember();
    redraw();
  });
  slider.addEventListener("input", () => {
    smoothing = Number(slider.value);
    sliderLabel.textContent = smoothing.toFixed(2);
    remember();
    redraw();
  });
  document.body.dataset.xaxis = xMode;
  const grid = el("div", { id: "charts" });
  const sections = new Map();
  sections.container = grid;
  const constants = el("div", { id: "constants" });
  const epochs = el("div", { id: "epochs" }, el("p", { class: "muted" }, "loading…"));
  const alerts = el("div", { id: "run-alerts" }, el("p", { class: "muted" }, "loading…"));
  const firing = el("div", { id: "firing" }, el("p", { class: "muted" }, "loading…"));
  const summary = el("div", { id: "summary" }, el("p", { class: "muted" }, "loading…"));
  const config = el("pre", { id: "config" }, "loading…");
  const health = el("div", { id: "health" });
  const media = el("div", { id: "media" }, el("p", { class: "muted", id: "media-none" }, "no media logged (run.log_image, log_video, log_audio, log_text)"));
  const mediaShown = {}; // name -> its panel, kept across updates (the slider where the user left it)
  // on top: health and what fires now; then the charts (reward and loss first), the summary
  const top = el("div", { class: "top" }, el("div", {}, el("h3", {}, "Health"), health), el("div", {}, el("h3", {}, "Firing alerts"), firing));
  main.replaceChildren(head, facts, links, top,
    el("h3", {}, "Series"), el("p", { class: "controls" }, filter, " x axis ", axis, " smoothing ", slider, " ", sliderLabel), grid,
    el("h3", {}, "Summary"), summary, constants,
    el("h3", {}, "Media"), media, el("h3", {}, "All alerts"), alerts, el("h3", {}, "Epochs"), epochs, el("h3", {}, "Config"), config);
  showHealth(runId, health);
  setInterval(() => showHealth(runId, health), 15000);
  const shown = (c) => !c.hide && !(filterText && !c.name.toLowerCase().includes(filterText));
  const showSections = () => {
    for (const s of sections.values()) s.box.hidden = ![...s.grid.children].some((b) => !b.hidden);
  };
  filter.addEventListener("input", () => {
    filterText = filter.value.toLowerCase();
    for (const c of Object.values(charts)) c.box.hidden = !shown(c);
    showSections();
  });
  window.addEventListener("resize", () => {
    for (const c of Object.values(charts)) c.plot.setSize({ width: Math.max(300, c.box.clientWidth - 14), height: 180 });
  });
  const singles = {}; // name -> its last point, for the summary table
  const kept = {}; // name -> its points: series that are no chart (yet): constants, states
  follow(`/api/runs/${encodeURIComponent(runId)}/stream`, "run", (run) => {
    window.mbRun = run; // the last update, for tests and the curious
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
      if (xMode === "relative") redraw();
    }
    const roles = run.roles || {};
    const derived = new Set(run.derived || []);
    const names = new Set([...Object.keys(run.series), ...Object.keys(charts), ...Object.keys(kept)]);
    const touched = new Set();
    for (const [name, points] of Object.entries(run.series)) {
      if (isSingle(name)) {
        if (points.length) singles[name] = points[points.length - 1];
        continue;
      }
      if (derived.has(name) && SMOOTHINGS.some((x) => name.endsWith(x) && names.has(name.slice(0, -x.length)))) continue;
      const mine = (kept[name] ??= []);
      const added = extend(mine, points, run.max_points);
      // a chart once the series varies (and is no state); until then a row of the table below
      if (charts[name] || (!isState(name) && constantOf(mine) === undefined)) {
        const fresh = !charts[name];
        const c = chartFor(sections, name, roles, derived.has(name), runId);
        c.points = mine;
        if (added || fresh) touched.add(c); // redrawn only when it changed: a pointer's readout stays
      }
    }
    for (const c of touched) {
      const canLog = mbPlot.logable(c.points.map((p) => p[1]));
      if (c.log && !canLog) makePlot(c);
      else c.plot.setData(plotData(c));
      if (c.logButton.disabled === canLog) makePlot(c);
    }
    // a finished run's series of one point is one value: in the summary, not a chart of a dot
    for (const c of Object.values(charts)) {
      c.single = Boolean(run.finished) && c.points.length === 1;
      if (c.single) singles[c.name] = c.points[0];
      c.hide = c.single;
      c.box.hidden = !shown(c);
    }
    showSections();
    const steady = Object.entries(kept).filter(([n, ps]) => !charts[n] && ps.length && !(run.finished && ps.length === 1 && singles[n]));
    constants.replaceChildren(...(steady.length ? [
      el("h3", {}, `Constant series and states (${steady.length})`),
      el("p", { class: "muted" }, "Series whose every value so far is the same, and 0/1 or -1/0/+1 states (their values per epoch are columns of the epochs table): a row each, not a chart."),
      table(["series", "value (the last)", "points", "steps"], steady.sort(([a], [b]) => a.localeCompare(b)).map(([n, ps]) => [n, el("td", { class: "num" }, fmt(ps[ps.length - 1][1])), el("td", { class: "num" }, ps.length), `${ps[0][0]}-${ps[ps.length - 1][0]}`]), "constants-table"),
    ] : []));
    // the summary leads with the last value of each series the run logged (W&B's summary)
    const lastRows = Object.entries(run.series)
      .filter(([n, ps]) => ps.length && !derived.has(n) && !isSingle(n))
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([n, ps]) => [n, el("td", { class: "num" }, fmt(ps[ps.length - 1][1])), `last, step ${ps[ps.length - 1][0]}`]);
    const rows = [
      ...lastRows,
      ...Object.entries(run.summary || {}).map(([k, v]) => [k, el("td", { class: "num" }, fmt(v)), "run summary"]),
      ...Object.entries(singles).sort(([a], [b]) => a.localeCompare(b)).map(([k, p]) => [k, el("td", { class: "num" }, fmt(p[1])), `step ${p[0]}`]),
    ];
    summary.replaceChildren(rows.length ? table(["name", "value", "at"], rows, "summary-table") : el("p", { class: "muted" }, "nothing logged yet"));
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
  const parts = h.parts.map((p) => [p.name, el("td", { class: "num" }, `${(p.weight - p.deducted).toFixed(1)} of ${p.weight}`), el("td", { class: "muted" }, p.deducted ? `${p.deducted.toFixed(1)} deducted` : "nothing deducted"), el("td", { class: "wrap" }, p.evidence.join("; ") || "-")]);
  const labels = (h.labels || []).map((r) => [r.label, el("td", { class: "num" }, r.events), Object.entries(r).filter(([k]) => k !== "label" && k !== "events").map(([k, v]) => `${k} ${v.toPrecision(4)}`).join(", ")]);
  const worst = h.parts.filter((p) => p.deducted > 0).sort((a, b) => b.deducted - a.deducted)[0];
  box.replaceChildren(
    el("p", { class: "score", id: "health-score" }, `${Math.round(h.score)}/100`),
    el("p", { class: "muted" }, worst ? `most deducted: ${worst.name} (${worst.evidence[0] || "-"})` : "nothing deducted"),
    el("details", { id: "health-details" }, el("summary", {}, "every part and its evidence"),
      table(["part", "points", "deducted", "evidence"], parts, "health-parts"),
      ...(labels.length ? [table(["label", "events", "final-window means"], labels, "health-labels")] : [])),
  );
}

