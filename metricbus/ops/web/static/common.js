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

// a number for a person (4 significant digits; exponents for the very large and small)
const fmt = (v) => mbPlot.value(v);

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

