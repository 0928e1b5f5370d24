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
else runsPage();
