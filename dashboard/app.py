"""The feedback page: a FastAPI app with server-rendered pages, a JSON API and exports.

Pages (HTML, Jinja2, plots as inline SVG; no script, nothing loaded from outside
this server):

- ``/lines/{line}``: signal counts and rates over time per adapter version,
  routing (champion, canary, share), the canary's online numbers against the
  champion, and the latest cleaning funnel;
- ``/lines/{line}/samples``: browsable samples, scrubbed, filtered by time,
  signal and adapter, keyset-paginated; ``/samples/{request_id}`` shows one with
  its edit as a diff and where it was used in training;
- ``/lines/{line}/funnel``: raw → scrubbed → deduplicated → training data per
  build, with why records were dropped;
- ``/lines/{line}/evals``: MLflow runs for a data scientist (comparison plot,
  sample generations side by side, gate reasons, links to the MLflow UI);
- ``/lines/{line}/review``: the review queue, for keys with the reviewer role
  on the line (:mod:`dashboard.review_routes`).

The same views as JSON under ``/api/lines/...``, and the visible bucket as
``export.csv`` / ``export.jsonl``. Access: see :mod:`dashboard.access`.
Refusals are 4xx with a message; an unexpected error is a 500 that names no
internals, and is logged by type only (exception messages may quote data).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime, timedelta
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from jinja2 import Environment, PackageLoader, select_autoescape
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from dashboard import plots
from dashboard.access import COOKIE, Gatekeeper, Viewer, check_line, check_same_origin
from dashboard.attempts import FailedKeyAttempts
from dashboard.errors import PageError
from dashboard.evals import EvalReview
from dashboard.experiments import add_experiment_routes
from dashboard.exports import csv_lines, jsonl_lines
from dashboard.filters import SAMPLE_SIGNALS, BucketFilter, parse_cursor, parse_filter
from dashboard.lineage import (
    DatasetIndex,
    drop_reasons,
    funnel_signals,
    funnel_steps,
    restored_examples,
)
from dashboard.pages import FeedbackPages, funnel_dict
from dashboard.review_queue import ReviewQueue
from dashboard.review_routes import add_review_routes
from dashboard.scrubbed import SampleScrubber
from dashboard.sessions import LoginSessions
from dashboard.shaping import RATE_SIGNALS, human_span, human_time
from feedback.reviews import ReviewPolicy
from feedback.rollup import SignalRollup
from feedback.store import FeedbackStore
from flywheel.bodies import BodyStalledError, BodyTooLargeError, read_body
from flywheel.http_guard import where_it_failed, withhold_tracebacks
from flywheel.settings import Settings
from flywheel.settings.dashboard import DashboardSettings
from flywheel.wording import sure
from registry.canary import VERDICT_WORDS, metric_label, metric_value

if TYPE_CHECKING:
    from mlflow import MlflowClient

    from feedback.pii import Scrubber
    from gateway.keys import KeyRing
    from registry.routes import RouteStore

logger = logging.getLogger("flywheel.dashboard")
JSON = "application/json"
LINES_TTL_S = 5.0
# A login form is a key and a path: anything larger is refused before it is read.
LOGIN_BODY_LIMIT = 16_384
LOGIN_STALL_S = 10.0
# The pages run no script and load nothing from elsewhere; the stylesheet is this server's
# and the only inline styles are style="" attributes (plot swatches), never <style> blocks.
CONTENT_SECURITY_POLICY = (
    "default-src 'none'; style-src 'self'; style-src-attr 'unsafe-inline'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)


def _templates() -> Environment:
    environment = Environment(
        loader=PackageLoader("dashboard", "templates"),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    environment.filters["percent"] = lambda v: "–" if v is None else f"{v:.1%}"
    environment.filters["number"] = lambda v: "–" if v is None else f"{v:,}"
    environment.filters["when"] = human_time
    environment.filters["span"] = human_span
    environment.filters["signed"] = lambda v: "–" if v is None else f"{v:+.1%}"
    environment.filters["metric"] = metric_label
    environment.filters["verdict"] = lambda v: VERDICT_WORDS.get(v, v)
    environment.filters["sure"] = lambda p: "–" if p is None else sure(p)
    environment.globals["metric_value"] = metric_value
    environment.filters["until_day"] = lambda v: (
        BucketFilter(until=v).params().get("until", "")[:10]
    )
    environment.globals.update(
        funnel_steps=funnel_steps,
        drop_reasons=drop_reasons,
        funnel_signals=funnel_signals,
        restored_examples=restored_examples,
    )
    return environment


def _back_link(value: str | None) -> str:
    """The query string of the samples page a sample was opened from (nothing else)."""
    return value if value and value.startswith("?") and "\n" not in value else ""


def security_headers(path: str) -> dict[str, str]:
    """The headers an answer to ``path`` carries: a content security policy, no MIME
    sniffing, no referrer, and no caching of anything but the stylesheet (pages, API
    answers, exports and errors may all show user text)."""
    headers = {
        "Content-Security-Policy": CONTENT_SECURITY_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    if not path.startswith("/static/"):
        headers["Cache-Control"] = "no-store"
    return headers


class _SecurityHeaders:
    """ASGI middleware setting :func:`security_headers` on every HTTP answer (replacing a
    handler's own value of the same header)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = [
            (k.lower().encode(), v.encode()) for k, v in security_headers(scope["path"]).items()
        ]
        names = {name for name, _ in extra}

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message["headers"] = kept + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)


def _json(body: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type=JSON)


def _wants_json(request: Request) -> bool:
    path = request.url.path
    return path.startswith("/api/") or path.endswith((".csv", ".jsonl"))


class _KnownLines:
    """Configured lines plus those with traffic, re-read every few seconds."""

    def __init__(self, configured: tuple[str, ...], rollup: SignalRollup) -> None:
        self.configured = configured
        self.rollup = rollup
        self._lines: list[str] = []
        self._read_at = 0.0
        self._lock = threading.Lock()

    def __call__(self) -> list[str]:
        now = time.monotonic()
        with self._lock:
            if now - self._read_at < LINES_TTL_S and self._lines:
                return self._lines
        lines = sorted(set(self.configured) | set(self.rollup.lines()))
        with self._lock:
            self._lines, self._read_at = lines, now
        return lines


def build_pages(
    settings: Settings,
    dashboard: DashboardSettings,
    engine: Engine,
    *,
    routes: RouteStore,
    scrubber_factory: Callable[[], Scrubber],
    mlflow_client_factory: Callable[[], MlflowClient] | None = None,
) -> FeedbackPages:
    """Every view's data source, built from the settings and the clients it is handed
    (nothing heavy loads until used: the scrubber on the first sample, MLflow on the first
    eval page)."""
    from registry.tracking import tracking_uri_for

    rollup = SignalRollup(
        engine,
        grace=timedelta(seconds=dashboard.rollup_grace_s),
        min_fold_interval_s=dashboard.rollup_interval_s,
    )
    tracking_uri = tracking_uri_for(settings.home, settings.mlflow_tracking_uri)
    return FeedbackPages(
        engine,
        dashboard,
        routes=routes,
        rollup=rollup,
        scrubber=SampleScrubber(scrubber_factory, dashboard.scrub_cache_size),
        datasets=DatasetIndex(settings.datasets_dir),
        evals=EvalReview(
            tracking_uri,
            dashboard.resolved_mlflow_ui(settings.mlflow_tracking_uri),
            client_factory=mlflow_client_factory,
        ),
        configured_lines=tuple(settings.business_lines),
    )


def create_app(
    settings: Settings,
    dashboard: DashboardSettings,
    *,
    store: FeedbackStore,
    routes: RouteStore,
    scrubber_factory: Callable[[], Scrubber],
    keys: KeyRing | None = None,
    keys_file: Path | None = None,
    mlflow_client_factory: Callable[[], MlflowClient] | None = None,
    review_policy_of: Callable[[str], ReviewPolicy | None] | None = None,
    clock: Callable[[], datetime] | None = None,
    on_shutdown: Callable[[], None] | None = None,
) -> FastAPI:
    """The feedback page over the clients it is handed (the store, its routing tables, the
    scrubber, built on the first sample, and MLflow's client, on the first eval page);
    ``on_shutdown`` runs when the server stops (``composition.servers`` closes its
    clients). Without ``keys`` it reads the gateway's key file (``keys_file`` or the
    configured one); when that file does not exist the page is open on loopback.
    ``review_policy_of`` gives each line's review block (its recipe's; none without it).
    Login sessions live in the store; ``clock`` (UTC now) ends them, for tests."""

    withhold_tracebacks()

    feedback_store = store
    if keys is None and keys_file is None:
        keys_file = settings.gateway.resolved_keys_file(settings.home)
    sessions = LoginSessions(
        feedback_store.engine,
        timedelta(seconds=dashboard.session_lifetime_s),
        **({"clock": clock} if clock is not None else {}),
    )
    attempts = FailedKeyAttempts(dashboard.failed_key_checks, dashboard.failed_key_window_s)
    gatekeeper = Gatekeeper(keys_file, keys, sessions, attempts)
    pages = build_pages(
        settings,
        dashboard,
        feedback_store.engine,
        routes=routes,
        scrubber_factory=scrubber_factory,
        mlflow_client_factory=mlflow_client_factory,
    )
    rollup = pages.rollup
    known_lines = _KnownLines(settings.business_lines, rollup)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # What is imported and built by now lives as long as the server. Frozen out of the
        # collector, a full collection walks only request garbage: without it the overview
        # stalls 150-250 ms every few seconds on a full collection (p99 619 ms vs p50 93 ms).
        gc.freeze()
        # The first fold of a big store takes seconds: start it now, not on the first view.
        warmup = threading.Thread(
            target=_warm, args=(rollup,), name="dashboard-rollup", daemon=True
        )
        warmup.start()
        try:
            yield
        finally:
            gc.unfreeze()
            if on_shutdown is not None:
                on_shutdown()

    app = FastAPI(
        title="flywheel feedback page",
        version="1",
        lifespan=lifespan,
        docs_url=None,
        redoc_url=None,
    )
    app.add_middleware(_SecurityHeaders)
    app.state.pages = pages
    app.state.gatekeeper = gatekeeper
    review_queue = ReviewQueue(
        feedback_store,
        review_policy_of or _no_review_policy,
        routes=routes,
        **({"clock": clock} if clock is not None else {}),
    )
    app.state.review_queue = review_queue
    templates = _templates()
    templates.globals["has_review_queue"] = review_queue.has_queue
    _add_routes(app, pages, gatekeeper, known_lines, templates, review_queue)
    return app


def _no_review_policy(business_line: str) -> None:
    return None


def _warm(rollup: SignalRollup) -> None:
    try:
        rollup.refresh(force=True)
    except Exception as exc:  # the page still answers, counting live
        logger.warning("dashboard: rollup warm-up failed (%s)", type(exc).__name__)


class _Context:
    """What every handler needs: the views, who is asking, the filters, the templates."""

    def __init__(
        self,
        pages: FeedbackPages,
        gatekeeper: Gatekeeper,
        known_lines: _KnownLines,
        templates: Environment,
    ) -> None:
        self.pages = pages
        self.gatekeeper = gatekeeper
        self.known_lines = known_lines
        self.templates = templates

    def render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A template rendered with the page-wide helpers."""
        html = self.templates.get_template(name).render(
            plots=plots, signals=SAMPLE_SIGNALS, rate_signals=RATE_SIGNALS, **context
        )
        return HTMLResponse(html, status_code=status)

    def viewer_of(self, request: Request) -> Viewer:
        """The caller (401/403 when refused)."""
        client = request.client.host if request.client else None
        return self.gatekeeper.viewer(
            request.headers.get("authorization"), request.cookies.get(COOKIE), client
        )

    def line_view(self, request: Request, business_line: str) -> tuple[Viewer, list[str]]:
        """The caller, checked against the line, and every line it may switch to."""
        viewer = self.viewer_of(request)
        known = self.known_lines()
        check_line(viewer, business_line, known)
        return viewer, viewer.lines_among(known)

    @staticmethod
    def bucket_of(request: Request) -> BucketFilter:
        """The filters of the request's query string."""
        query = request.query_params
        return parse_filter(
            query.get("since"), query.get("until"), query.get("signal"), query.get("adapter")
        )


def _add_routes(
    app: FastAPI,
    pages: FeedbackPages,
    gatekeeper: Gatekeeper,
    known_lines: _KnownLines,
    templates: Environment,
    review_queue: ReviewQueue | None = None,
) -> None:
    """Pages, API, exports, login, the review queue, and the error handlers."""
    context = _Context(pages, gatekeeper, known_lines, templates)
    _add_error_handlers(app, context)
    _add_access_routes(app, context)
    _add_pages(app, context)
    _add_api(app, context)
    add_experiment_routes(app, context, pages.engine, grace=pages.rollup.grace)
    if review_queue is not None:
        add_review_routes(app, context, review_queue, pages.scrubber)


def _add_error_handlers(app: FastAPI, context: _Context) -> None:
    render = context.render

    @app.exception_handler(PageError)
    async def _refused(request: Request, exc: PageError) -> Response:
        response: Response
        if _wants_json(request):
            response = _json({"error": exc.message}, exc.status)
        elif exc.status == 401:
            response = render(
                "login.html", status=401, message=exc.message, next=request.url.path, lines=[]
            )
        else:
            response = render("error.html", status=exc.status, message=exc.message, lines=[])
        response.headers.update(exc.headers)
        return response

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> Response:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        message = f"bad request: {where}: {first.get('msg', 'invalid')}"
        return await _refused(request, PageError(400, message))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        return await _refused(request, PageError(exc.status_code, str(exc.detail)))

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, exc: Exception) -> Response:
        logger.error(
            "dashboard: %s on %s", where_it_failed(exc.__traceback__, type(exc)), request.url.path
        )
        response = await _refused(request, PageError(500, "internal error in the feedback page"))
        # This handler answers outside the middleware stack: set its headers here.
        response.headers.update(security_headers(request.url.path))
        return response


def _add_access_routes(app: FastAPI, context: _Context) -> None:
    render, gatekeeper = context.render, context.gatekeeper

    @app.get("/healthz")
    def healthz() -> Response:
        return _json({"status": "ok", "open_mode": gatekeeper.open_mode})

    @app.get("/static/style.css")
    def stylesheet() -> Response:
        css = resources.files("dashboard").joinpath("static/style.css").read_bytes()
        return Response(css, media_type="text/css", headers={"Cache-Control": "max-age=300"})

    @app.get("/login")
    def login_form(request: Request) -> Response:
        return render("login.html", message=None, next=request.query_params.get("next"), lines=[])

    @app.post("/login")
    async def login(request: Request) -> Response:
        # Login CSRF: another site must not log this browser in under a key of its choice.
        check_same_origin(request, "a login")
        client = request.client.host if request.client else None
        gatekeeper.check_attempts(client)
        try:
            # An unauthenticated client must not make the server hold a large or slow body.
            body = await read_body(
                request.stream(),
                request.headers.get("content-length"),
                LOGIN_BODY_LIMIT,
                LOGIN_STALL_S,
            )
        except (BodyTooLargeError, BodyStalledError) as exc:
            status = 413 if isinstance(exc, BodyTooLargeError) else 408
            return render("login.html", status=status, message=str(exc), next="/", lines=[])
        form = parse_qs(body.decode("utf-8", "replace"))
        token = (form.get("key") or [""])[0].strip()
        target = (form.get("next") or ["/"])[0]
        if not target.startswith("/") or target.startswith("//"):
            target = "/"
        # A write to the store: off the event loop.
        opened = await run_in_threadpool(gatekeeper.log_in, token, client)
        if opened is None:
            return render(
                "login.html", status=401, message="unknown API key", next=target, lines=[]
            )
        response = RedirectResponse(target, status_code=303)
        response.set_cookie(
            COOKIE,
            opened.session_id,
            max_age=opened.max_age_s,
            path="/",
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
        )
        return response

    @app.post("/logout")
    def logout(request: Request) -> Response:
        check_same_origin(request, "a logout")
        gatekeeper.log_out(request.cookies.get(COOKIE))
        response = RedirectResponse("/login", status_code=303)
        response.delete_cookie(
            COOKIE, path="/", httponly=True, samesite="strict", secure=request.url.scheme == "https"
        )
        return response

    @app.get("/")
    def home(request: Request) -> Response:
        viewer = context.viewer_of(request)
        lines = viewer.lines_among(context.known_lines())
        if not lines:
            raise PageError(403, f"your key ({viewer.name}) may see no business line")
        return RedirectResponse(f"/lines/{quote(lines[0])}", status_code=303)


def _add_pages(app: FastAPI, context: _Context) -> None:
    render, pages = context.render, context.pages
    line_view, bucket_of = context.line_view, context.bucket_of

    @app.get("/lines/{business_line}")
    def overview(request: Request, business_line: str) -> Response:
        viewer, lines = line_view(request, business_line)
        view = pages.overview(business_line, bucket_of(request))
        return render("overview.html", view=view, viewer=viewer, lines=lines, tab="overview")

    @app.get("/lines/{business_line}/samples")
    def samples(request: Request, business_line: str) -> Response:
        viewer, lines = line_view(request, business_line)
        bucket = bucket_of(request)
        cursor = parse_cursor(request.query_params.get("cursor"))
        view = pages.samples(business_line, bucket, cursor)
        adapters = pages.rollup.adapters(business_line)
        return render(
            "samples.html",
            view=view,
            viewer=viewer,
            lines=lines,
            tab="samples",
            adapters=adapters,
            first_page=cursor is None,
        )

    @app.get("/lines/{business_line}/samples/{request_id:path}")
    def sample(request: Request, business_line: str, request_id: str) -> Response:
        viewer, lines = line_view(request, business_line)
        found, uses = pages.sample(business_line, request_id)
        return render(
            "sample.html",
            sample=found,
            uses=uses,
            viewer=viewer,
            lines=lines,
            business_line=business_line,
            tab="samples",
            back=_back_link(request.query_params.get("back")),
        )

    @app.get("/lines/{business_line}/funnel")
    def funnel(request: Request, business_line: str) -> Response:
        viewer, lines = line_view(request, business_line)
        builds = pages.funnel(business_line)
        return render(
            "funnel.html",
            builds=builds,
            viewer=viewer,
            lines=lines,
            business_line=business_line,
            tab="funnel",
        )

    @app.get("/lines/{business_line}/evals")
    def evals(request: Request, business_line: str) -> Response:
        viewer, lines = line_view(request, business_line)
        view = pages.eval_page(business_line, request.query_params.get("run"))
        return render(
            "evals.html",
            view=view,
            viewer=viewer,
            lines=lines,
            business_line=business_line,
            tab="evals",
        )

    @app.get("/lines/{business_line}/export.{kind}")
    def export(request: Request, business_line: str, kind: str) -> Response:
        line_view(request, business_line)
        if kind not in {"csv", "jsonl"}:
            raise PageError(404, f"no export as {kind!r}; use export.csv or export.jsonl")
        bucket = bucket_of(request)
        rows = pages.export(business_line, bucket)
        uses = pages.datasets
        stream = (
            csv_lines(rows, business_line, uses)
            if kind == "csv"
            else jsonl_lines(rows, business_line, uses)
        )
        media = "text/csv" if kind == "csv" else "application/x-ndjson"
        name = f"{business_line}-samples.{kind}"
        return StreamingResponse(
            stream,
            media_type=media,
            headers={"Content-Disposition": f'attachment; filename="{name}"'},
        )


def _add_api(app: FastAPI, context: _Context) -> None:
    pages, line_view, bucket_of = context.pages, context.line_view, context.bucket_of

    @app.get("/api/lines")
    def api_lines(request: Request) -> Response:
        viewer = context.viewer_of(request)
        return _json({"viewer": viewer.name, "lines": viewer.lines_among(context.known_lines())})

    @app.get("/api/lines/{business_line}/overview")
    def api_overview(request: Request, business_line: str) -> Response:
        line_view(request, business_line)
        return _json(pages.overview(business_line, bucket_of(request)).as_dict())

    @app.get("/api/lines/{business_line}/samples")
    def api_samples(request: Request, business_line: str) -> Response:
        line_view(request, business_line)
        cursor = parse_cursor(request.query_params.get("cursor"))
        return _json(pages.samples(business_line, bucket_of(request), cursor).as_dict())

    @app.get("/api/lines/{business_line}/samples/{request_id:path}")
    def api_sample(request: Request, business_line: str, request_id: str) -> Response:
        line_view(request, business_line)
        found, uses = pages.sample(business_line, request_id)
        body = found.as_dict() | {
            "diff": [{"op": s.op, "text": s.text} for s in found.diff()],
            "training": [u.as_dict() for u in uses],
        }
        return _json(body)

    @app.get("/api/lines/{business_line}/funnel")
    def api_funnel(request: Request, business_line: str) -> Response:
        line_view(request, business_line)
        return _json({"builds": [funnel_dict(b) for b in pages.funnel(business_line)]})

    @app.get("/api/lines/{business_line}/evals")
    def api_evals(request: Request, business_line: str) -> Response:
        line_view(request, business_line)
        return _json(pages.eval_page(business_line, request.query_params.get("run")).as_dict())
