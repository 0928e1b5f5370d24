// -- experiments: the archive's runs in a table; chosen runs compared and grouped ----------

const GROUP_COLORS = ["#2f6fde", "#e8710a", "#12b5cb", "#9334e6", "#1e8e3e", "#d93025", "#f9ab00", "#5f6368"];
const ALPHA = (hex, a) => hex + Math.round(a * 255).toString(16).padStart(2, "0");

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
  let plot = null, asked = 0, logScale = false;
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
      values.push(mbPlot.smooth(at(b, b.mean), st.smooth));
      series.push({ label: `${b.group} (${b.runs.length})`, stroke: color, width: 2, spanGaps: true, points: { show: false } });
      if (b.runs.length > 1) {
        values.push(mbPlot.smooth(at(b, b.upper), st.smooth), mbPlot.smooth(at(b, b.lower), st.smooth));
        const edge = { stroke: ALPHA(color, 0.3), width: 1, spanGaps: true, points: { show: false } };
        series.push({ ...edge, label: `${b.group} upper` }, { ...edge, label: `${b.group} lower` });
        fills.push({ series: [values.length - 2, values.length - 1], fill: ALPHA(color, 0.15) });
      }
    });
    if (plot) plot.destroy();
    const grouped = chart.scores.length > 0;
    const title = `${chart.metric}: ${grouped ? `${bands.length} group(s), ${st.band === "std" ? "mean ± std" : "mean, min to max"}` : "each run"}`;
    const canLog = mbPlot.logable(values.slice(1).flat());
    if (!canLog) logScale = false;
    const logButton = el("button", { class: `tool log${logScale ? " on" : ""}`, type: "button", title: canLog ? "a log scale for the y axis" : "no log scale: the values reach 0 or below" }, "log");
    logButton.disabled = !canLog;
    logButton.addEventListener("click", () => { logScale = !logScale; render(chart); });
    const csvButton = el("button", { class: "tool csv", type: "button", title: "this chart's lines as CSV (smoothed as drawn)" }, "CSV");
    csvButton.addEventListener("click", () => mbPlot.csv(["step", ...series.slice(1).map((s) => s.label)], xs.map((x, i) => [x, ...values.slice(1).map((col) => col[i])]), mbPlot.fileName(chart.metric, "csv")));
    const pngButton = el("button", { class: "tool png", type: "button", title: "this chart as a PNG image" }, "PNG");
    pngButton.addEventListener("click", () => mbPlot.png(plot, title, mbPlot.fileName(chart.metric, "png")));
    const plotBox = el("div", { class: "plot" });
    chartBox.replaceChildren(el("div", { class: "chart-head" }, el("span", { class: "title" }, title), el("span", { class: "tools" }, logButton, csvButton, pngButton)), plotBox);
    // the readout: each line's value at the step under the pointer (a band's edges are no lines)
    const lines = series.map((s, i) => [s, i]).filter(([s, i]) => i > 0 && !/ (upper|lower)$/.test(s.label));
    const readout = mbPlot.readout((u, idx) => ({
      title: `step ${xs[idx]}`,
      rows: lines.filter(([, i]) => u.data[i][idx] != null).map(([s, i]) => [s.label, s.stroke, mbPlot.value(u.data[i][idx])]),
    }));
    plot = new uPlot({ width: Math.max(400, chartBox.clientWidth - 14), height: 320, series, bands: fills, legend: { show: false }, axes: [{}, mbPlot.yAxis()], scales: { x: { time: false }, y: logScale ? { distr: 3, log: 10 } : {} }, plugins: [readout] }, values, plotBox);
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
        el("td", {}, s.group, s.best ? el("span", { class: "state live best", title: `the ${dir === "higher" ? "highest" : "lowest"} IQM of the groups: whether it differs from the baseline is the verdict's to say` }, "best IQM") : ""),
        el("td", { class: "num" }, s.runs.length),
        el("td", { class: "num" }, fmt(s.iqm) + interval(s.interval)),
        el("td", { class: "num" }, s.std == null ? "-" : fmt(s.std)),
        el("td", { class: "num" }, c ? fmt(c.mean - c.baseline_mean) + interval(c.interval) : s.group === chart.baseline_group ? "baseline" : "-"),
        el("td", { class: "num" }, c ? c.p_value.toPrecision(3) : "-"),
        el("td", { class: "wrap verdict" }, ...(c ? [...(c.verdict === "cannot tell" ? [] : [badge(c.verdict === "worse" ? "REGRESSION" : c.verdict), " "]), c.said] : ["-"])),
      ];
    });
    const diff = Object.entries(chart.config_diff || {}).map(([k, vs]) => [k, [...new Set(Object.values(vs).map((v) => JSON.stringify(v)))].join(", ")]);
    stats.replaceChildren(
      el("p", { class: "muted" }, `${chart.metric}: ${dir} is better. Each run's final window (its last tenth, at least 5 values) is one value; each group's IQM of them with a 95% bootstrap interval. Against the baseline: Welch's t-test on the runs' values and the 95% interval of the difference of means it implies; the verdict is "better" or "worse" only when that interval leaves out 0, else it says how many runs a group would take.`),
      table(["group", "runs", "IQM [95% CI]", "std of runs", "mean vs baseline [95% CI]", "Welch p", "verdict"], rows, "group-table"),
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

