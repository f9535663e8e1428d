"""The review queue's pages and API (see :mod:`dashboard.review_queue`).

- ``GET /lines/{line}/review``: the reviewer's next answer, scrubbed and blind (no
  adapter, arm, user or request id), with a verdict form;
- ``POST /lines/{line}/review/{item}``: the form's verdict (pass/fail, a rubric reason,
  an optional corrected answer), then on to the next item;
- ``GET /api/lines/{line}/review/next`` and ``POST /api/lines/{line}/review/{item}``
  (JSON ``{"verdict", "reason", "correction"}``): the same for scripts.

Only keys with the reviewer role on the line (``review_lines`` in the key file) may
use them (403 otherwise). Forms keep the page's protections: the session cookie is
``SameSite=Strict`` and ``HttpOnly``, the CSP allows forms to post only here, and a
form or a cookie-authenticated API call must carry a token derived from the session
(``review_token``), which another site cannot read; a request whose ``Origin`` is
another site is refused.
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Protocol
from urllib.parse import parse_qs, quote

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from starlette.concurrency import run_in_threadpool

from dashboard.access import COOKIE, Viewer, check_same_origin
from dashboard.errors import PageError
from dashboard.review_queue import ReviewItem, ReviewQueue, ReviewVerdictIn
from dashboard.scrubbed import SampleScrubber
from flywheel.bodies import BodyStalledError, BodyTooLargeError, read_body
from gateway.keys import bearer_token

REVIEW_BODY_LIMIT = 256 * 1024
REVIEW_STALL_S = 10.0
TOKEN_HEADER = "x-review-token"  # noqa: S105 (a header name)


class PageContext(Protocol):
    """What the review routes need of the page: templates and who is asking."""

    def render(self, name: str, status: int = 200, **context: Any) -> HTMLResponse:
        """A template rendered with the page-wide helpers."""
        ...

    def line_view(self, request: Request, business_line: str) -> tuple[Viewer, list[str]]:
        """The caller, checked against the line, and the lines it may switch to."""
        ...


def review_token(session_id: str | None) -> str:
    """The token a review form carries: derived from the session id (which only this
    browser holds, in an HttpOnly cookie), so another site cannot forge it."""
    if not session_id:
        return ""
    return hmac.new(session_id.encode(), b"flywheel-review-form", hashlib.sha256).hexdigest()


def require_reviewer(viewer: Viewer, business_line: str) -> str:
    """The reviewer's name; 403 for a key without the reviewer role on the line."""
    if viewer.key is None or not viewer.key.may_review(business_line):
        raise PageError(
            403,
            f"your key ({viewer.name}) has no reviewer role on {business_line!r}: "
            f"add the line to its review_lines in the gateway's key file",
        )
    return viewer.name


def _check_token(request: Request, given: str | None) -> None:
    """A cookie-authenticated write needs the session's review token (a Bearer key does not:
    a browser never sends one on its own)."""
    if bearer_token(request.headers.get("authorization")):
        return
    expected = review_token(request.cookies.get(COOKIE))
    if not expected or not given or not hmac.compare_digest(expected, given):
        raise PageError(403, "the review form's token is missing or stale: reload the page")


async def _body(request: Request) -> bytes:
    try:
        return await read_body(
            request.stream(),
            request.headers.get("content-length"),
            REVIEW_BODY_LIMIT,
            REVIEW_STALL_S,
        )
    except BodyTooLargeError as exc:
        raise PageError(413, str(exc)) from None
    except BodyStalledError as exc:
        raise PageError(408, str(exc)) from None


def _item_number(item: str) -> int:
    if not item.isdigit() or len(item) > 18:
        raise PageError(404, f"no review item {item!r}: items are numbered")
    return int(item)


def _shown(item: ReviewItem, scrubber: SampleScrubber) -> dict[str, Any]:
    """What a reviewer sees of an item: the scrubbed prompt and answer, nothing else."""
    (sample,) = scrubber.scrub([item.raw])
    return {
        "item": item.item,
        "messages": [dict(m) for m in sample.messages],
        "answer": sample.response,
        "expires_at": item.expires_at.isoformat(),
    }


def add_review_routes(
    app: FastAPI, context: PageContext, queue: ReviewQueue, scrubber: SampleScrubber
) -> None:
    """The review queue's page, form and API."""

    @app.get("/lines/{business_line}/review")
    def review_page(request: Request, business_line: str) -> Response:
        viewer, lines = context.line_view(request, business_line)
        reviewer = require_reviewer(viewer, business_line)
        policy = queue.policy(business_line)
        item = queue.next_item(business_line, reviewer)
        saved = request.query_params.get("saved")
        return context.render(
            "review.html",
            viewer=viewer,
            lines=lines,
            business_line=business_line,
            tab="review",
            item=_shown(item, scrubber) if item is not None else None,
            rubric=policy.rubric,
            token=review_token(request.cookies.get(COOKIE)),
            reviewed=queue.reviewed_by(business_line, reviewer),
            saved=saved if saved and saved.isdigit() else None,
        )

    @app.post("/lines/{business_line}/review/{item}")
    async def review_form(request: Request, business_line: str, item: str) -> Response:
        viewer, _ = await run_in_threadpool(context.line_view, request, business_line)
        reviewer = require_reviewer(viewer, business_line)
        check_same_origin(request, "a review")
        form = parse_qs((await _body(request)).decode("utf-8", "replace"))

        def field(name: str) -> str | None:
            values = form.get(name)
            return values[0] if values else None

        _check_token(request, field("token"))
        number = _item_number(item)
        submitted = ReviewVerdictIn(
            field("verdict") or "", field("reason") or "", field("correction")
        )
        await run_in_threadpool(queue.submit, business_line, reviewer, number, submitted)
        return RedirectResponse(
            f"/lines/{quote(business_line)}/review?saved={number}", status_code=303
        )

    @app.get("/api/lines/{business_line}/review/next")
    def api_next(request: Request, business_line: str) -> Response:
        viewer, _ = context.line_view(request, business_line)
        reviewer = require_reviewer(viewer, business_line)
        policy = queue.policy(business_line)
        item = queue.next_item(business_line, reviewer)
        body = {
            "item": _shown(item, scrubber) if item is not None else None,
            "rubric": list(policy.rubric),
        }
        return Response(orjson.dumps(body), media_type="application/json")

    @app.post("/api/lines/{business_line}/review/{item}")
    async def api_submit(request: Request, business_line: str, item: str) -> Response:
        viewer, _ = await run_in_threadpool(context.line_view, request, business_line)
        reviewer = require_reviewer(viewer, business_line)
        check_same_origin(request, "a review")
        _check_token(request, request.headers.get(TOKEN_HEADER))
        number = _item_number(item)
        try:
            body = orjson.loads(await _body(request))
        except orjson.JSONDecodeError:
            raise PageError(400, "the body must be a JSON object") from None
        if not isinstance(body, dict):
            raise PageError(400, "the body must be a JSON object")
        unknown = sorted(set(body) - {"verdict", "reason", "correction"})
        if unknown:
            raise PageError(422, f"unknown fields {unknown}: send verdict, reason, correction")
        verdict, reason = body.get("verdict"), body.get("reason")
        correction = body.get("correction")
        if not isinstance(verdict, str) or not isinstance(reason, str):
            raise PageError(422, "verdict and reason are required, as text")
        if not isinstance(correction, str | None):
            raise PageError(422, "correction is text or null")
        submitted = ReviewVerdictIn(verdict, reason, correction)
        await run_in_threadpool(queue.submit, business_line, reviewer, number, submitted)
        # Never the request id: it would lead a reviewer to the sample and its adapter.
        stored = {"item": number, "verdict": submitted.verdict, "reason": submitted.reason}
        return Response(orjson.dumps(stored), status_code=201, media_type="application/json")
