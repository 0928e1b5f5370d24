"""The live dashboard, Prometheus ``/metrics`` and health checks: one Starlette app.

Pages (one HTML shell; ``static/app.js`` draws each): ``/`` runs, ``/runs/{run_id}`` one run
(live charts of its logged and derived series, epochs, alerts, config, and its health from
the archive, ``/api/runs/{run_id}/health``), ``/alerts``,
``/pipeline`` (lag per group, dead letters, spools, sinks catching up). Data: ``/api/...`` as JSON, and
server-sent events (``/api/stream``, ``/api/runs/{run_id}/stream``) for live updates.

The app only reads snapshots of a :class:`RunBoard` (its own consumer thread) and of a
:class:`Pipeline` (lag samples on a thread); a slow or closed browser waits on nothing of a
consumer's. Bound to 127.0.0.1 unless told otherwise; anywhere else it needs a token
(``Authorization: Bearer T``, or ``?token=T`` once, which sets a cookie).
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from metricbus.ops._archived import ArchivedRuns, RuleFiles
from metricbus.ops._board import RunBoard
from metricbus.ops._pipeline import Pipeline
from metricbus.schemas import (
    MEDIA_TYPES,
    MediaMissing,
    MediaStore,
    MetricbusError,
    Settings,
    check_run_id,
    ref_of,
    strict_json,
)

log = logging.getLogger("metricbus.dashboard")

WEB = Path(__file__).parent / "web"
#: How often a stream looks for changes, and the longest silence before a keep-alive.
STREAM_TICK_S = 0.5
TB_LOOK_S = 5.0  #: how often a run's page looks for its TensorBoard directory until it exists
KEEPALIVE_S = 15.0
MAX_COMPARED = 1000  #: runs one grouped chart takes
STOP_S = 5.0  #: the longest the dashboard waits for its threads at a stop
#: A run's health is computed from the archive at most this often (per run).
HEALTH_EVERY_S = 10.0
#: ... and no sooner than this many times what it took: a long run's health reads the whole run
#: from the archive (seconds, ~4.5 KB per event held), and an open run page asks every 15 s
HEALTH_COST_FACTOR = 10.0
#: A run's health whose archive files have not changed since it was judged is kept this long
#: (only its dead letters could have changed meanwhile)
HEALTH_UNCHANGED_KEEP_S = 600.0


def health_stale(computed_at: float, took_s: float, now: float) -> bool:
    """Whether a run's cached health is due to be computed again."""
    return now - computed_at >= max(HEALTH_EVERY_S, HEALTH_COST_FACTOR * took_s)


def health_fresh(computed_at: float, took_s: float, now: float, unchanged: Callable[[], bool]) -> bool:
    """Whether a run's cached health may answer.

    When it is not stale, or its archive files are ``unchanged`` since it was judged (asked only
    then), for at most HEALTH_UNCHANGED_KEEP_S.
    """
    if not health_stale(computed_at, took_s, now):
        return True
    return now - computed_at < HEALTH_UNCHANGED_KEEP_S and unchanged()


def build_app(
    settings: Settings,
    board: RunBoard,
    pipeline: Pipeline,
    token: str | None = None,
    archived: ArchivedRuns | None = None,
) -> Any:
    """The Starlette app; the caller starts (and stops) ``board``, ``pipeline`` and ``archived``.

    ``archived``: runs the topics no longer hold, listed and drawn from the archive.
    """
    archive = archived or ArchivedRuns(settings)
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response, StreamingResponse
    from starlette.routing import Mount, Route
    from starlette.staticfiles import StaticFiles

    from metricbus.ops._experiments import grouped_chart, metric_names, runs_table
    from metricbus.ops._metrics import render_metrics

    shell = (WEB / "app.html").read_text()

    def page(request: Request) -> Response:
        run_id = request.path_params.get("run_id")
        if run_id is not None and not (_known(board, run_id) or archive.holds(run_id)):
            return HTMLResponse(_not_found(f"No run {run_id!r}: not on the topics, not in the archive"), 404)
        return HTMLResponse(shell)

    def api_status(request: Request) -> Response:
        columns = request.query_params.get("columns") == "1"
        return JSONResponse(_overview(settings, board, pipeline, archive, columns))

    def api_run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        detail = (board.run(run_id) or archive.page(run_id)) if _valid(run_id) else None
        if detail is None:
            return JSONResponse({"error": f"no run {run_id[:200]!r}"}, status_code=404)
        return JSONResponse({**detail, "tensorboard": _tensorboard_dirs(settings, run_id)})

    async def stream(request: Request) -> Response:
        columns = request.query_params.get("columns") == "1"  # the runs page's config and values

        async def events() -> Any:
            version, sent = -1, 0.0
            while not await request.is_disconnected():
                if board.version != version or time.monotonic() - sent > KEEPALIVE_S:
                    version = board.version
                    sent = time.monotonic()
                    yield _sse("status", _overview(settings, board, pipeline, archive, columns))
                await asyncio.sleep(1.0)

        return StreamingResponse(events(), media_type="text/event-stream", headers=_NO_CACHE)

    async def run_stream(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if not _known(board, run_id):
            page = await asyncio.to_thread(archive.page, run_id) if _valid(run_id) else None
            if page is None:
                return JSONResponse({"error": f"no run {run_id[:200]!r}"}, status_code=404)
            stream = _archived_stream(request, {**page, "tensorboard": _tensorboard_dirs(settings, run_id)})
            return StreamingResponse(stream, media_type="text/event-stream", headers=_NO_CACHE)

        async def events() -> Any:
            version, sent = -1, 0.0
            since: dict[str, int] = {}
            media_sent = -1  # the run's media index goes out again only when it changed
            tensorboard: list[str] = []
            looked = -TB_LOOK_S
            while not await request.is_disconnected():
                if board.version != version:
                    version = board.version
                    detail = board.run(run_id, since)
                    if not tensorboard and time.monotonic() - looked > TB_LOOK_S:  # until the sink made it
                        looked = time.monotonic()
                        tensorboard = _tensorboard_dirs(settings, run_id)
                    if detail is not None:
                        detail["tensorboard"] = tensorboard
                        for name, points in detail["series"].items():
                            if points:
                                since[name] = points[-1][0]
                        detail["series"] = {n: p for n, p in detail["series"].items() if p}
                        if detail["media_count"] == media_sent:
                            del detail["media"]
                        media_sent = detail["media_count"]
                        sent = time.monotonic()
                        yield _sse("run", detail)
                elif time.monotonic() - sent > KEEPALIVE_S:
                    sent = time.monotonic()
                    yield ": keep-alive\n\n"
                await asyncio.sleep(STREAM_TICK_S)

        return StreamingResponse(events(), media_type="text/event-stream", headers=_NO_CACHE)

    report_lock = threading.Lock()  # one report at a time: each reads a whole run

    def report(request: Request) -> Response:
        """The run's report (``metricbus report``), built from the archive when asked for."""
        run_id = request.path_params["run_id"]
        if not _valid(run_id) or not archive.holds(run_id):
            return HTMLResponse(_not_found(f"No run {run_id!r} in the archive to report on"), 404)
        with report_lock:
            page = _report(settings, run_id, archive.rules)
        return HTMLResponse(page)

    #: (run, with its dead letters) -> (at, took, health, its archive files when judged)
    health_cache: dict[tuple[str, bool], tuple[float, float, dict[str, Any], Any]] = {}
    health_lock = threading.Lock()  # one at a time: each holds a whole run's events

    def fresh_health(key: tuple[str, bool]) -> dict[str, Any] | None:
        cached = health_cache.get(key)
        if cached is None:
            return None
        at, took, found, files = cached

        def unchanged() -> bool:
            return _archive_files(settings, key[0]) == files

        return found if health_fresh(at, took, time.monotonic(), unchanged) else None

    def api_health(request: Request) -> Response:
        """The run's health from the archive (``metricbus health``), computed again only when stale.

        ``?dead_letters=1``: with the run's dead letters counted, as ``metricbus health`` does
        (which asks here when a stack runs: this process has the archive's reader warm).
        """
        run_id = request.path_params["run_id"]
        if not _valid(run_id):
            return JSONResponse({"error": f"no run {run_id[:200]!r}"}, status_code=404)
        key = (run_id, request.query_params.get("dead_letters") == "1")
        if (fresh := fresh_health(key)) is not None:  # waits on no other run's computation
            return JSONResponse(fresh)
        with health_lock:  # pages of one run asking together wait for one computation
            if (fresh := fresh_health(key)) is not None:
                return JSONResponse(fresh)
            started = time.monotonic()
            files = _archive_files(settings, run_id)  # before the read: a change meanwhile is seen next time
            found = _health(settings, *key)
            if found is None:
                return JSONResponse({"error": f"run {run_id!r} is not in the archive (yet)"}, status_code=404)
            health_cache[key] = (time.monotonic(), time.monotonic() - started, found, files)
        return JSONResponse(found)

    def series_csv(request: Request) -> Response:
        """Every archived point of one series of a run, as CSV (the chart's download)."""
        run_id, name = request.path_params["run_id"], request.query_params.get("name", "")
        if not _valid(run_id) or not name or len(name) > 1000:
            return JSONResponse({"error": "a run and ?name=<series> are needed"}, status_code=404)
        rows = _series_rows(settings, run_id, name)
        if rows is None:
            return JSONResponse({"error": f"run {run_id!r} is not in the archive (yet)"}, status_code=404)
        filename = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{run_id}-{name}").strip("_") + ".csv"
        headers = {"Content-Disposition": f'attachment; filename="{filename}"'}
        return Response(rows, media_type="text/csv", headers=headers)

    def api_experiments(request: Request) -> Response:
        """The archive's runs table (of ``?project=``), with its config keys."""
        project = request.query_params.get("project") or None
        return _strict(runs_table(archive.run_rows(), project[:200] if project else None))

    def _chosen(request: Request) -> list[str] | JSONResponse:
        runs = [r for r in request.query_params.get("runs", "").split(",") if r][:MAX_COMPARED]
        bad = [r for r in runs if not _valid(r)]
        if bad or not runs:
            return JSONResponse({"error": f"runs: {', '.join(bad)[:200] or 'none chosen'}"}, status_code=400)
        return runs

    def api_experiment_metrics(request: Request) -> Response:
        runs = _chosen(request)
        if isinstance(runs, JSONResponse):
            return runs
        chosen = set(runs)
        projects = {r["project"] for r in archive.run_rows() if r["run_id"] in chosen}
        project = projects.pop() if len(projects) == 1 else None  # one project's files, not all
        return JSONResponse({"metrics": metric_names(settings.archive_dir, runs, project)})

    def api_experiment_chart(request: Request) -> Response:
        """One metric of the chosen runs, grouped (``?group_by=lr,batch``; empty: none)."""
        runs = _chosen(request)
        if isinstance(runs, JSONResponse):
            return runs
        q = request.query_params
        metric, band = q.get("metric", "")[:500], q.get("band", "std")
        if not metric or band not in ("std", "minmax"):
            return JSONResponse({"error": "metric=NAME and band=std|minmax"}, status_code=400)
        keys = None if "group_by" not in q else [k[:200] for k in q["group_by"].split(",") if k][:20]
        baseline = q.get("baseline") or None
        chart = grouped_chart(settings.archive_dir, archive.run_rows(), runs, metric, keys, band, baseline)
        return _strict(chart)

    media_store = MediaStore.of(settings)

    def media(request: Request) -> Response:
        """A media item's bytes by digest, verified, as one of the four types metricbus writes.

        Content-addressed, so cached for good; ``nosniff`` and a sandbox keep bytes from a topic
        from ever running as a page of the dashboard's origin.
        """
        kind = request.query_params.get("kind", "")
        try:
            data = media_store.get(ref_of(request.path_params["digest"]))
        except MediaMissing as exc:
            return JSONResponse({"error": str(exc)}, status_code=404)
        headers = {
            "Cache-Control": "public, max-age=31536000, immutable",
            "X-Content-Type-Options": "nosniff",
            "Content-Security-Policy": "sandbox; default-src 'none'",
        }
        return Response(data, media_type=MEDIA_TYPES.get(kind, "application/octet-stream"), headers=headers)

    def metrics(request: Request) -> Response:
        body, content_type = render_metrics(board, pipeline)
        return Response(body, media_type=content_type)

    def healthz(request: Request) -> Response:
        return JSONResponse({"ok": True})

    def readyz(request: Request) -> Response:
        problems = []
        if not board.caught_up.is_set():
            problems.append("still reading the topics")
        if board.error:
            problems.append(f"topics: {board.error}")
        if pipeline.samples == 0:
            problems.append("no consumer-group sample yet")
        if pipeline.latest.get("error"):
            problems.append(f"consumer groups: {pipeline.latest['error']}")
        return JSONResponse(
            {"ready": not problems, "problems": problems}, status_code=503 if problems else 200
        )

    routes = [
        Route("/", page),
        Route("/alerts", page),
        Route("/pipeline", page),
        Route("/experiments", page),
        Route("/api/experiments", api_experiments),
        Route("/api/experiments/metrics", api_experiment_metrics),
        Route("/api/experiments/chart", api_experiment_chart),
        Route("/runs/{run_id:str}", page),
        Route("/runs/{run_id:str}/report", report),
        Route("/api/status", api_status),
        Route("/api/stream", stream),
        Route("/api/runs/{run_id:str}", api_run),
        Route("/api/runs/{run_id:str}/stream", run_stream),
        Route("/api/runs/{run_id:str}/health", api_health),
        Route("/api/runs/{run_id:str}/series.csv", series_csv),
        Route("/api/media/{digest:str}", media),
        Route("/metrics", metrics),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Mount("/static", StaticFiles(directory=WEB / "static"), name="static"),
    ]
    app = Starlette(routes=routes)

    if token:
        inner = app

        async def guarded(scope: Any, receive: Any, send: Any) -> None:
            if scope["type"] == "http" and scope["path"] not in ("/healthz", "/readyz"):
                request = Request(scope)
                given = request.query_params.get("token") or request.cookies.get("metricbus_token") or ""
                auth = request.headers.get("authorization", "")
                if auth.lower().startswith("bearer "):
                    given = auth[7:]
                if not hmac.compare_digest(given.encode(), token.encode()):
                    await PlainTextResponse("a token is needed (?token=...)", status_code=401)(
                        scope, receive, send
                    )
                    return
                if request.query_params.get("token"):

                    async def with_cookie(message: Any) -> None:
                        if message["type"] == "http.response.start":
                            cookie = f"metricbus_token={token}; HttpOnly; SameSite=Strict; Path=/"
                            message["headers"] = [*message["headers"], (b"set-cookie", cookie.encode())]
                        await send(message)

                    await inner(scope, receive, with_cookie)
                    return
            await inner(scope, receive, send)

        return guarded
    return app


_NO_CACHE = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def _stop_all(parts: list[Any], within_s: float) -> None:
    """Stop the dashboard's threads together, waiting at most ``within_s`` for all of them.

    Each stop joins its thread (the board 5 s, the pipeline 10 s, the archive reader 5 s); one
    after the other, with a broker gone at the same moment (``up`` killed), they took over ten
    seconds and the dashboard outlived ``up``. What has not stopped by then is a daemon thread:
    it ends with the process.
    """
    stoppers = [threading.Thread(target=part.stop, daemon=True) for part in parts]
    for stopper in stoppers:
        stopper.start()
    deadline = time.monotonic() + within_s
    for stopper in stoppers:
        stopper.join(max(0.0, deadline - time.monotonic()))


def _strict(data: Any) -> Any:
    """A JSON response any parser reads (NaN and infinities null: ``schemas.strict_json``)."""
    from starlette.responses import Response

    return Response(strict_json(data), media_type="application/json")


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), allow_nan=False)}\n\n"


def _valid(run_id: str) -> bool:
    try:
        check_run_id(run_id)
    except MetricbusError:
        return False
    return True


def _known(board: RunBoard, run_id: str) -> bool:
    return _valid(run_id) and board.run(run_id) is not None


def _archive_files(settings: Settings, run_id: str) -> frozenset[tuple[str, int, int]]:
    """The run's archive files as (path, size, modified ns): what its health was judged from."""
    from metricbus.sinks._archive import run_files

    out = set()
    for path in run_files(settings.archive_dir, run_id):
        try:
            stat = path.stat()
        except OSError:  # compacted away meanwhile: the set differs anyway
            continue
        out.add((str(path), stat.st_size, stat.st_mtime_ns))
    return frozenset(out)


def _health(settings: Settings, run_id: str, dead_letters: bool = False) -> dict[str, Any] | None:
    """``metricbus health`` of an archived run as JSON; None when the archive has none of its events.

    ``dead_letters``: the run's dead letters read and judged too (the run page leaves them to
    the pipeline view).
    """
    from metricbus.diagnostics import dead_letters_of, judge, read_logged

    try:
        seen, _ = read_logged(settings.archive_dir, run_id)  # its columns: no object per event
    except (OSError, ValueError, MetricbusError):
        return None
    return judge(run_id, seen, dead_letters_of(settings, run_id) if dead_letters else None).as_dict()


async def _archived_stream(request: Any, page: dict[str, Any]) -> Any:
    """A run the topics no longer hold: its archived page once, then keep-alives."""
    yield _sse("run", page)
    while not await request.is_disconnected():
        await asyncio.sleep(KEEPALIVE_S)
        yield ": keep-alive\n\n"


def _tensorboard_dirs(settings: Settings, run_id: str) -> list[str]:
    """Where the stack's TensorBoard sink wrote the run (none yet, or no TensorBoard sink)."""
    from metricbus.sinks.tensorboard import run_dirs

    try:
        return [str(d) for d in run_dirs(settings.data_dir / "tensorboard", run_id)]
    except (MetricbusError, OSError):
        return []


def _report(settings: Settings, run_id: str, rules: RuleFiles) -> str:
    """``metricbus report`` of an archived run, as a page (the stack's alert rules on its events)."""
    from metricbus.diagnostics import build, read_run
    from metricbus.diagnostics._backtest import archived, raising

    alerts: list[dict[str, Any]] = []
    events = archived(settings, run_id, derived=True)
    run = read_run(events, lambda logged: raising(logged, alerts, rules.rules, rules.config))
    return str(build(run_id, run, {}, alerts, media=MediaStore.of(settings)))


def _series_rows(settings: Settings, run_id: str, name: str) -> str | None:
    """``step,wall_time,value`` of every archived point of ``name`` (logged or derived), in order."""
    import csv
    import io

    from metricbus.sinks import tidy

    try:
        table = tidy(settings.archive_dir, run_id, names=[name])
    except (FileNotFoundError, ValueError, OSError):
        return None
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", "wall_time", "value"])
    for step, wall, value in zip(
        table["step"].to_pylist(), table["wall_time"].to_pylist(), table["value"].to_pylist(), strict=True
    ):
        writer.writerow([step, wall.isoformat(timespec="milliseconds"), repr(value)])
    return out.getvalue()


def _overview(
    settings: Settings,
    board: RunBoard,
    pipeline: Pipeline,
    archive: ArchivedRuns | None = None,
    columns: bool = False,
) -> dict[str, Any]:
    """What ``status`` and the overview pages show; ``columns``: each run's config and values too."""
    live = board.runs_table(columns)
    alerts = board.alerts()
    pending = 0
    if archive is not None:  # the archived runs the topics no longer hold, after the live ones
        held = {r["run_id"] for r in live}
        older = [r for run_id, r in archive.rows(columns).items() if run_id not in held]
        live += sorted(older, key=lambda r: -(r["started_ms"] or 0))
        alerts += [a for a in archive.alerts() if a["run_id"] not in held]
        alerts.sort(key=lambda a: -a["ts_ms"])
        pending = archive.alerts_pending
    return {
        "at": round(time.time(), 3),
        "kafka": settings.bootstrap_servers,
        "runs": live,
        "alerts": alerts[:200],
        "alerts_pending": pending,
        "pipeline": pipeline.latest,
        "board": {"records": board.records, "skipped": board.skipped, "error": board.error},
    }


def _not_found(what: str) -> str:
    """A 404 page in the dashboard's own look, with the way back to the runs."""
    import html

    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>not found · metricbus</title>"
        '<link rel="stylesheet" href="/static/app.css"></head><body>'
        '<header><a class="brand" href="/">metricbus</a><nav><a href="/">Runs</a>'
        '<a href="/alerts">Alerts</a><a href="/pipeline">Pipeline</a></nav></header>'
        f'<main><h2>Not found</h2><p>{html.escape(what)}.</p><p><a href="/">All runs</a> · '
        "<code>metricbus runs</code> lists the archived ones.</p></main></body></html>"
    )


def serve(
    settings: Settings,
    host: str = "127.0.0.1",
    port: int = 8765,
    token: str | None = None,
    since_s: float | None = None,
    rules: RuleFiles | None = None,
) -> None:
    """Run the dashboard until SIGINT/SIGTERM; then stop cleanly and return (exit code 0).

    ``rules``: what archived runs' pages and reports show as their alerts (the seed pack).
    """
    import contextlib
    import signal

    import uvicorn

    class Server(uvicorn.Server):
        # uvicorn re-raises a captured SIGTERM after shutting down (the process then dies by
        # it, code -15, skipping our clean-up): we take the signals ourselves.
        @contextlib.contextmanager
        def capture_signals(self) -> Any:
            yield

    board = RunBoard(settings, since_s=since_s).start()
    pipeline = Pipeline(settings).start()
    archived = ArchivedRuns(settings, rules=rules).start()
    try:
        app = build_app(settings, board, pipeline, token=token, archived=archived)
        config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False)
        server = Server(config)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: setattr(server, "should_exit", True))
        server.run()
        if not server.started:
            raise MetricbusError(f"the dashboard cannot listen on {host}:{port} (in use? try another --port)")
    finally:
        _stop_all([board, pipeline, archived], STOP_S)
