"""``/docs``: the gateway's API as a page that needs nothing but the gateway.

Swagger UI and ReDoc (FastAPI's ``/docs`` and ``/redoc``) load their scripts and styles
from a CDN, which a machine without internet access cannot reach, and no package the
gateway installs ships them; so ``/docs`` is rendered here from the OpenAPI document, as
plain HTML without scripts: each route with its summary, request fields and answers, and a
link to ``/openapi.json``, which any OpenAPI viewer or client generator loads.
"""

from __future__ import annotations

from html import escape
from typing import Any

SCHEMA_URL = "/openapi.json"
_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
    "h2{margin-top:2rem;font-family:monospace}table{border-collapse:collapse;width:100%}"
    "td,th{border-bottom:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}"
    "code{background:#f4f4f4;padding:0 .2rem}"
)


def _type_of(field: dict[str, Any]) -> str:
    """A JSON schema's type in a few words (``string | null``, ``array of ChatMessage``)."""
    if "$ref" in field:
        return str(field["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in field:
        return " | ".join(_type_of(option) for option in field["anyOf"])
    if "enum" in field:
        return " | ".join(repr(value) for value in field["enum"])
    if field.get("type") == "array":
        return f"array of {_type_of(field.get('items', {}))}"
    return str(field.get("type", "any"))


def _fields(schema: dict[str, Any], components: dict[str, Any]) -> str:
    """The rows of a request body's fields (those it names; extra fields may pass too)."""
    if "$ref" in schema:
        schema = components.get(str(schema["$ref"]).rsplit("/", 1)[-1], {})
    required = set(schema.get("required", ()))
    rows = [
        f"<tr><td><code>{escape(name)}</code>{' (required)' if name in required else ''}</td>"
        f"<td>{escape(_type_of(field))}</td>"
        f"<td>{escape(str(field.get('description', '')))}</td></tr>"
        for name, field in schema.get("properties", {}).items()
    ]
    if not rows:
        return ""
    head = "<tr><th>field</th><th>type</th><th>what it is</th></tr>"
    return f"<table>{head}{''.join(rows)}</table>"


def _operation(
    method: str, path: str, operation: dict[str, Any], components: dict[str, Any]
) -> str:
    body = operation.get("requestBody", {}).get("content", {}).get("application/json", {})
    answers = ", ".join(
        f"{code} {answer.get('description', '')}".strip()
        for code, answer in operation.get("responses", {}).items()
    )
    return (
        f"<h2>{escape(method.upper())} {escape(path)}</h2>"
        f"<p>{escape(str(operation.get('summary', '')))}</p>"
        + _fields(body.get("schema", {}), components)
        + f"<p>Answers: {escape(answers)}</p>"
    )


def docs_page(schema: dict[str, Any]) -> str:
    """The HTML of ``/docs`` for an OpenAPI ``schema``."""
    info = schema.get("info", {})
    components = schema.get("components", {}).get("schemas", {})
    operations = "".join(
        _operation(method, path, operation, components)
        for path, methods in schema.get("paths", {}).items()
        for method, operation in methods.items()
    )
    title = escape(str(info.get("title", "API")))
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title>"
        f"<style>{_STYLE}</style></head><body><h1>{title}</h1>"
        f"<p>{escape(str(info.get('description', '')))}</p>"
        f'<p>The OpenAPI document: <a href="{SCHEMA_URL}">{SCHEMA_URL}</a>. Load it into any '
        "OpenAPI viewer or client generator to try the routes; this page is plain HTML, since "
        "the interactive viewers load their code from the internet, which a gateway's "
        "machine may not reach.</p>"
        "<p>Authenticate with <code>Authorization: Bearer &lt;your key&gt;</code>. An answer's "
        "<code>id</code> (and its <code>x-request-id</code> header) is the "
        "<code>request_id</code> that feedback names.</p>"
        f"{operations}</body></html>"
    )
