// metricbus charts: what every chart of the dashboard and of `metricbus report` shares. Axis
// labels a person can read at any magnitude, the value under the pointer, TensorBoard's
// debiased smoothing, a log scale where it means something, and a chart's data and picture to
// download. Plain functions over uPlot; no other dependency (the report inlines this file).
"use strict";

const mbPlot = (() => {
  function node(tag, cls, text) {
    const n = document.createElement(tag);
    if (cls) n.className = cls;
    if (text != null) n.textContent = text;
    return n;
  }

  // one tick label: "0" only for 0; exponents past 1e5 and under 1e-3
  function tick(v, digits, exp) {
    if (v == null || !Number.isFinite(v)) return "";
    if (v === 0) return "0";
    if (exp) return v.toExponential(digits).replace(/\.?0+e/, "e").replace("e+", "e");
    return v.toFixed(digits);
  }

  // labels for a y axis's ticks: the fewest digits that tell every tick apart and never show a
  // tick that is not 0 as "0" (3e-4 with its neighbours reads 2.9e-4, 3e-4, 3.1e-4, not 0, 0, 0)
  function tickLabels(splits) {
    const finite = splits.filter((v) => v != null && Number.isFinite(v));
    if (!finite.length) return splits.map(() => "");
    const big = Math.max(...finite.map(Math.abs));
    const exp = big >= 1e5 || (big > 0 && big < 1e-3);
    for (let d = 0; d <= 16; d++) {
      const labels = splits.map((v) => tick(v, d, exp));
      const distinct = new Set(labels).size === labels.length;
      const honest = splits.every((v, i) => v == null || v === 0 || Number(labels[i]) !== 0);
      if (distinct && honest) return labels;
    }
    return splits.map((v) => (v == null ? "" : String(v)));
  }

  // a value for a person: 4 significant digits, exponents for the very large and very small
  function value(v) {
    if (v == null) return "-";
    if (typeof v === "string") return v; // NaN, inf as the server names them
    if (!Number.isFinite(v)) return String(v);
    if (Number.isInteger(v) && Math.abs(v) < 1e15) return String(v);
    const a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) return v.toExponential(3).replace(/\.?0+e/, "e").replace("e+", "e");
    return String(Number(v.toPrecision(4)));
  }

  // TensorBoard's smoothing: an exponential moving average, debiased at the start; gaps kept
  function smooth(values, weight) {
    if (!weight) return values;
    let last = 0;
    let n = 0;
    return values.map((v) => {
      if (v == null || !Number.isFinite(v)) return null;
      last = last * weight + (1 - weight) * v;
      n += 1;
      return last / (1 - Math.pow(weight, n));
    });
  }

  // A uPlot plugin: a box by the pointer with what ``describe(u, idx)`` gives for the point
  // under it: {title, rows: [[label, colour, text]]}. Synced charts show theirs too.
  function readout(describe) {
    let box = null;
    return {
      hooks: {
        init: (u) => {
          box = node("div", "readout");
          box.hidden = true;
          u.over.append(box);
        },
        setCursor: (u) => {
          const { left, top, idx } = u.cursor;
          if (idx == null || left == null || left < 0) {
            box.hidden = true;
            return;
          }
          const said = describe(u, idx);
          if (!said) {
            box.hidden = true;
            return;
          }
          box.replaceChildren(node("div", "readout-title", said.title));
          for (const [label, colour, text] of said.rows) {
            const row = node("div", "readout-row");
            const swatch = node("i");
            swatch.style.background = colour;
            row.append(swatch, node("span", null, `${label} `), node("b", null, text));
            box.append(row);
          }
          box.hidden = false;
          const w = box.offsetWidth;
          const wide = u.over.clientWidth;
          box.style.left = `${left + 14 + w > wide ? Math.max(0, left - w - 14) : left + 14}px`;
          box.style.top = `${Math.max(0, Math.min((top >= 0 ? top : 10) - 10, u.over.clientHeight - box.offsetHeight))}px`;
        },
      },
    };
  }

  // whether a log scale can show these values: every one above 0 (null: gaps)
  function logable(values) {
    let any = false;
    for (const v of values) {
      if (v == null) continue;
      if (!(v > 0)) return false;
      any = true;
    }
    return any;
  }

  // the y axis every chart uses: readable labels, room for them
  function yAxis() {
    return { size: 64, values: (u, splits) => tickLabels(splits) };
  }

  // the chart as a PNG: its title above the canvas uPlot drew (axes included), on white
  function png(u, title, filename) {
    const src = u.ctx.canvas;
    const pad = 28;
    const out = document.createElement("canvas");
    out.width = src.width;
    out.height = src.height + pad * (window.devicePixelRatio || 1);
    const ctx = out.getContext("2d");
    ctx.fillStyle = "#fff";
    ctx.fillRect(0, 0, out.width, out.height);
    ctx.fillStyle = "#1d2433";
    ctx.font = `${Math.round(14 * (window.devicePixelRatio || 1))}px system-ui, sans-serif`;
    ctx.fillText(title, 8, 19 * (window.devicePixelRatio || 1));
    ctx.drawImage(src, 0, pad * (window.devicePixelRatio || 1));
    save(out.toDataURL("image/png"), filename);
  }

  function save(href, filename) {
    const a = document.createElement("a");
    a.href = href;
    a.download = filename;
    document.body.append(a);
    a.click();
    a.remove();
  }

  // rows of columns as a CSV file (quoted where needed)
  function csv(headers, rows, filename) {
    const cell = (c) => (c == null ? "" : /[",\n]/.test(String(c)) ? `"${String(c).replace(/"/g, '""')}"` : String(c));
    const text = [headers, ...rows].map((r) => r.map(cell).join(",")).join("\n") + "\n";
    save(URL.createObjectURL(new Blob([text], { type: "text/csv" })), filename);
  }

  // a file name from a series name: what a file system takes
  function fileName(name, ext) {
    return `${String(name).replace(/[^A-Za-z0-9._-]+/g, "_").replace(/^_+|_+$/g, "") || "chart"}.${ext}`;
  }

  return { tickLabels, value, smooth, readout, logable, yAxis, png, csv, save, fileName };
})();
