const COLORS = ["#2f6fde", "#e0732c", "#2a9d5b", "#b53fb1", "#8a6d1f", "#555"];
const AXES = { step: "step", relative: "minutes since the run started", wall: "UTC" };
const root = document.getElementById("charts");
const choice = document.getElementById("xaxis");
// a point is [step, value, ts_ms]; each line's run started at c.t0[line] (ms)
const xOf = {
  step: (p) => p[0],
  relative: (p, t0) => (p[2] - t0) / 60000,
  wall: (p) => p[2] / 1000,
};
function draw(mode) {
  root.replaceChildren();
  let section = null, grid = null;
  for (const c of DATA.charts) {
    if (c.section !== section) {
      section = c.section;
      const h = document.createElement("h2"); h.textContent = section; root.appendChild(h);
      grid = document.createElement("div"); grid.className = "charts"; root.appendChild(grid);
    }
    const box = document.createElement("div"); box.className = "chart"; box.dataset.series = c.title;
    const h = document.createElement("h3"); h.textContent = c.title;
    box.appendChild(h); grid.appendChild(box);
    if (c.note) {
      const p = document.createElement("p");
      p.className = "muted"; p.textContent = c.note; box.appendChild(p);
    }
    const names = Object.keys(c.lines);
    const x = xOf[mode];
    const lines = names.map((n) => c.lines[n].map((p) => [x(p, c.t0[n]), p[1]]));
    const xs = [...new Set(lines.flatMap((l) => l.map((p) => p[0])))].sort((a, b) => a - b);
    const columns = lines.map((l) => {
      const m = new Map(l);
      return xs.map((v) => (m.has(v) ? m.get(v) : null));
    });
    const series = [{ label: AXES[mode] }, ...names.map((n, i) => ({
      label: n, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
      dash: n.endsWith(")") && !c.stepped ? [6, 4] : undefined,
      paths: c.stepped ? uPlot.paths.stepped({ align: 1 }) : undefined,
    }))];
    const opts = {
      width: 380, height: 200, scales: { x: { time: mode === "wall" } }, series,
      axes: [{ label: AXES[mode], labelSize: 18, size: 40 }, mbPlot.yAxis()],
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), "Etc/UTC"),
    };
    new uPlot(opts, [xs, ...columns], box);
    box.dataset.points = String(xs.length);
    box.dataset.xmin = String(xs[0]);
    box.dataset.xmax = String(xs[xs.length - 1]);
  }
  document.body.dataset.xaxis = mode;
}
// groups across seeds: each metric full width, each group's mean with its band
function drawGroups() {
  const root = document.getElementById("group-charts");
  if (!root) return;
  for (const g of DATA.groups) {
    const box = document.createElement("div");
    box.className = "chart wide";
    box.dataset.metric = g.metric;
    const h = document.createElement("h3");
    h.textContent = g.metric;
    box.appendChild(h);
    root.appendChild(box);
    const xs = [...new Set(g.bands.flatMap((b) => b.steps))].sort((a, b) => a - b);
    const at = (b, ys) => {
      const m = new Map(b.steps.map((s, i) => [s, ys[i]]));
      return xs.map((x) => (m.has(x) ? m.get(x) : null));
    };
    const series = [{ label: "step" }], values = [xs], bands = [];
    g.bands.forEach((b, i) => {
      const color = COLORS[i % COLORS.length];
      values.push(at(b, b.mean));
      const line = { stroke: color, width: 2, spanGaps: true, points: { show: false } };
      series.push({ ...line, label: `${b.group} (${b.runs})` });
      if (b.runs > 1) {
        values.push(at(b, b.upper), at(b, b.lower));
        const edge = { stroke: color + "55", width: 1, spanGaps: true, points: { show: false } };
        series.push({ ...edge, label: `${b.group} +std` }, { ...edge, label: `${b.group} -std` });
        bands.push({ series: [values.length - 2, values.length - 1], fill: color + "26" });
      }
    });
    const axes = [{ label: "step", labelSize: 18, size: 40 }, mbPlot.yAxis()];
    const width = Math.max(400, root.clientWidth - 16);
    const scales = { x: { time: false } };
    const lines = series.map((s, i) => [s, i]).filter(([s, i]) => i > 0 && !/ [+-]std$/.test(s.label));
    const readout = mbPlot.readout((u, idx) => ({
      title: `step ${xs[idx]}`,
      rows: lines.filter(([, i]) => u.data[i][idx] != null)
        .map(([s, i]) => [s.label, s.stroke, mbPlot.value(u.data[i][idx])]),
    }));
    const plotBox = document.createElement("div");
    plotBox.style.position = "relative";
    box.appendChild(plotBox);
    const opts = { width, height: 300, series, bands, axes, scales, legend: { show: false } };
    new uPlot({ ...opts, plugins: [readout] }, values, plotBox);
    const legend = document.createElement("p"); // a group an entry: its band's edges are no lines to read
    legend.className = "legend";
    g.bands.forEach((b, i) => {
      const entry = document.createElement("span");
      const swatch = document.createElement("i");
      swatch.style.background = COLORS[i % COLORS.length];
      entry.append(swatch, `${b.group} (${b.runs} run${b.runs > 1 ? "s" : ""})`);
      legend.appendChild(entry);
    });
    box.appendChild(legend);
    box.dataset.groups = String(g.bands.length);
  }
}
drawGroups();
const asked = new URLSearchParams(location.hash.slice(1)).get("x");
choice.value = asked in AXES ? asked : "step";
choice.addEventListener("change", () => { location.hash = "x=" + choice.value; draw(choice.value); });
draw(choice.value);
document.body.dataset.ready = "1";
