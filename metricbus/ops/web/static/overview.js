// -- runs, alerts, pipeline: the overview stream ------------------------------------------

// The runs, live and archived, side by side: choosable config, last-value and summary columns,
// sort, filter, and the runs ticked overlaid on any metric's chart (the Experiments page).
// One table kept across updates: what the person chose survives the live stream's redraws.
function runsPage() {
  const q = new URLSearchParams(location.hash.slice(1));
  const st = {
    filter: q.get("filter") || "",
    sort: q.get("sort") || "",
    desc: q.get("desc") === "1",
    cols: q.has("cols") ? q.get("cols").split(",").filter(Boolean) : null, // null: the defaults
    picked: new Set((q.get("runs") || "").split(",").filter(Boolean)),
  };
  const remember = () => {
    const out = new URLSearchParams();
    if (st.filter) out.set("filter", st.filter);
    if (st.sort) out.set("sort", st.sort);
    if (st.desc) out.set("desc", "1");
    if (st.cols) out.set("cols", st.cols.join(","));
    if (st.picked.size) out.set("runs", [...st.picked].join(","));
    history.replaceState(null, "", out.toString() ? "#" + out : "/");
  };
  let runs = [];
  const heading = el("h2", {}, "Runs");
  const filter = el("input", { class: "filter", id: "runs-filter", placeholder: "filter runs (name, id, project, config value)", value: st.filter });
  const colsBox = el("details", { id: "columns" });
  const overlay = el("a", { class: "button", id: "overlay" }, "Overlay the selected runs");
  const picked = el("span", { class: "muted", id: "picked" });
  const box = el("div", { id: "runs-box" });
  main.replaceChildren(heading, el("p", { class: "controls" }, filter, " ", colsBox, " ", overlay, " ", picked), box);
  filter.addEventListener("input", () => { st.filter = filter.value; remember(); draw(); });

  // a column is "config/<key>", "last/<series>" or "summary/<key>"
  const valueOf = (r, col) => {
    const [kind, ...rest] = col.split("/");
    const key = rest.join("/");
    const from = kind === "config" ? r.params : kind === "last" ? r.last : r.final;
    return from ? from[key] : undefined;
  };
  const available = () => {
    const keys = (field) => [...new Set(runs.flatMap((r) => Object.keys(r[field] || {})))].sort();
    return { config: keys("params"), last: keys("last"), summary: keys("final") };
  };
  // by default: the plain config values (numbers, short text) that differ between the runs
  // having them (one framework's run has keys another's lacks: that is no difference), and the
  // last reward and loss
  const plain = (v) => v === null || typeof v === "number" || typeof v === "boolean" || (typeof v === "string" && v.length <= 40);
  const defaults = () => {
    const a = available();
    const differ = a.config.filter((k) => {
      const values = runs.map((r) => (r.params || {})[k]).filter((v) => v !== undefined);
      return values.length > 1 && values.every(plain) && new Set(values.map((v) => JSON.stringify(v))).size > 1;
    });
    const main = a.last.filter((n) => /reward|return|loss/i.test(n) && !/_(ema|recent_mean)$/.test(n)).slice(0, 3);
    return [...differ.slice(0, 6).map((k) => `config/${k}`), ...main.map((n) => `last/${n}`), ...a.summary.slice(0, 3).map((k) => `summary/${k}`)];
  };
  const drawColumns = () => {
    const a = available();
    const chosen = new Set(st.cols || defaults());
    const group = (title, kind, keys) => keys.length ? [el("div", { class: "col-group" }, el("b", {}, title), ...keys.map((k) => {
      const b = el("input", { type: "checkbox", "data-col": `${kind}/${k}` });
      b.checked = chosen.has(`${kind}/${k}`);
      b.addEventListener("change", () => {
        st.cols = [...colsBox.querySelectorAll("input:checked")].map((x) => x.dataset.col);
        remember();
        draw();
      });
      return el("label", {}, b, ` ${k} `);
    }))] : [];
    const open = colsBox.open;
    colsBox.replaceChildren(el("summary", {}, "columns"), ...group("config", "config", a.config), ...group("last value", "last", a.last), ...group("summary", "summary", a.summary));
    colsBox.open = open;
  };
  const shown = () => {
    const f = st.filter.toLowerCase();
    const rows = runs.filter((r) => !f || [r.name, r.run_id, r.project, r.state, ...Object.entries(r.params || {}).map(([k, v]) => `${k}=${v}`)].some((t) => String(t).toLowerCase().includes(f)));
    if (st.sort) {
      const val = (r) => (st.sort.includes("/") ? valueOf(r, st.sort) : r[st.sort]);
      rows.sort((a, b) => {
        const x = val(a), y = val(b);
        const c = x == null ? 1 : y == null ? -1 : typeof x === "number" && typeof y === "number" ? x - y : String(x).localeCompare(String(y));
        return st.desc ? -c : c;
      });
    }
    return rows;
  };
  // a value as a cell: numbers formatted, anything long cut (the whole of it in the tooltip)
  const cell = (v) => {
    if (typeof v === "number") return el("td", { class: "num" }, fmt(v));
    if (v == null) return el("td", { class: "num" }, "-");
    const text = typeof v === "object" ? JSON.stringify(v) : String(v);
    return text.length <= 40 ? el("td", { class: "num" }, text) : el("td", { class: "num", title: text }, text.slice(0, 39) + "…");
  };
  function draw() {
    const cols = st.cols || defaults();
    const rows = shown();
    const heads = [["run", "run_id"], ["project", "project"], ["name", "name"], ["state", "state"], ["last step", "last_step"], ["events/s", "events_per_s"], ["last event", "since_last_event_s"],
      ...cols.map((c) => [c.replace(/^(config|summary)\//, "").replace(/^last\//, "last "), c]), ["firing alerts", null]];
    const all = el("input", { type: "checkbox", id: "select-shown", title: "select every run shown" });
    all.checked = rows.length > 0 && rows.every((r) => st.picked.has(r.run_id));
    all.addEventListener("change", () => {
      for (const r of rows) all.checked ? st.picked.add(r.run_id) : st.picked.delete(r.run_id);
      remember();
      draw();
    });
    const tr = el("tr", {}, el("th", {}, all));
    for (const [label, key] of heads) {
      const th = el("th", key ? { class: "sortable", "data-sort": key } : {}, label + (key && st.sort === key ? (st.desc ? " ▼" : " ▲") : ""));
      if (key) th.addEventListener("click", () => {
        st.desc = st.sort === key ? !st.desc : false;
        st.sort = key;
        remember();
        draw();
      });
      tr.append(th);
    }
    const body = el("tbody");
    for (const r of rows) {
      const tick = el("input", { type: "checkbox", "data-run": r.run_id });
      tick.checked = st.picked.has(r.run_id);
      tick.addEventListener("change", () => {
        tick.checked ? st.picked.add(r.run_id) : st.picked.delete(r.run_id);
        remember();
        drawPicked();
      });
      body.append(el("tr", { "data-run": r.run_id },
        el("td", {}, tick),
        el("td", {}, el("a", { href: `/runs/${encodeURIComponent(r.run_id)}` }, r.run_id)),
        el("td", {}, r.project),
        el("td", {}, r.name),
        el("td", {}, badge(r.state)),
        el("td", { class: "num" }, r.last_step == null ? "-" : r.last_step),
        el("td", { class: "num" }, r.events_per_s.toFixed(1)),
        el("td", { class: "num" }, age(r.since_last_event_s)),
        ...cols.map((c) => { const v = valueOf(r, c); return cell(v); }),
        el("td", {}, ...r.firing.map((f) => el("span", { class: "state firing" }, f))),
      ));
    }
    heading.textContent = `Runs (${runs.length})`;
    box.replaceChildren(runs.length
      ? el("div", { class: "tablebox" }, el("table", { id: "runs" }, el("thead", {}, tr), body))
      : el("p", { class: "muted", id: "runs" }, "No runs yet: log one (the README's quick start) and it appears here."));
    box.dataset.rows = String(rows.length);
    drawPicked();
  }
  function drawPicked() {
    const n = [...st.picked].filter((id) => runs.some((r) => r.run_id === id)).length;
    picked.textContent = `${n} selected`;
    overlay.classList.toggle("disabled", n === 0);
    const metric = (st.cols || defaults()).find((c) => c.startsWith("last/"));
    const h = new URLSearchParams({ runs: [...st.picked].join(","), group: "" });
    if (metric) h.set("metric", metric.slice(5));
    overlay.href = n ? `/experiments#${h}` : "#";
    overlay.title = n ? "each selected run as a line on one chart, any metric (the Experiments page)" : "tick runs in the table first";
  }
  follow("/api/stream?columns=1", "status", (status) => {
    runs = status.runs;
    drawColumns();
    draw();
  });
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
    el("td", { class: "num" }, g.commit_rate == null ? "-" : g.commit_rate.toFixed(1)),
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

