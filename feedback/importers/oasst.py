"""OpenAssistant conversation trees as flywheel events.

Every assistant reply becomes an interaction whose prompt is the conversation
up to it; each ``+1``/``-1`` reaction on an assistant reply becomes one thumbs
event; sibling assistant replies under one prompt are regenerations (each
reply but the last was regenerated away by the next); ranks among siblings are
kept as ``rank`` events (0 is best). The export carries no timestamps, so
each tree gets a deterministic synthetic time after ``start``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

from feedback.events import prompt_hash
from feedback.importers.business_rules import BusinessRules
from feedback.jsonl import JsonlItem, MalformedLine
from feedback.store import IngestItem

OASST_START = datetime(2023, 3, 24, tzinfo=UTC)
ROLE_OF = {"prompter": "user", "assistant": "assistant"}
SOURCE = "oasst"


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


class _TreeWalk:
    """Emits the events of one tree, depth first, with a monotonic clock."""

    def __init__(self, tree: dict[str, Any], rules: BusinessRules, start: datetime) -> None:
        root = tree["prompt"]
        self.tree_id = str(tree.get("message_tree_id") or root["message_id"])
        self.business_line = rules.business_line_for(root.get("text", ""), root.get("lang"))
        self.clock = start
        self.user_id = f"oasst-{self.tree_id}"

    def tick(self) -> datetime:
        self.clock += timedelta(seconds=30)
        return self.clock

    def events(
        self, node: dict[str, Any], history: list[dict[str, str]]
    ) -> Iterator[dict[str, Any]]:
        conversation = [*history, {"role": ROLE_OF[node["role"]], "content": node["text"]}]
        replies = [r for r in node.get("replies") or [] if not r.get("deleted")]
        assistants = [r for r in replies if r.get("role") == "assistant"]
        for position, reply in enumerate(assistants):
            yield from self._reply_events(reply, conversation, node.get("lang"))
            if position + 1 < len(assistants):
                yield {
                    "type": "regenerate",
                    "request_id": _request_id(reply),
                    "replaced_by": _request_id(assistants[position + 1]),
                    "idempotency_key": f"oasst:{reply['message_id']}:regenerate",
                    "user_id": self.user_id,
                    "created_at": _iso(self.tick()),
                }
        for reply in replies:
            yield from self.events(reply, conversation)

    def _reply_events(
        self, reply: dict[str, Any], prompt: list[dict[str, str]], language: str | None
    ) -> Iterator[dict[str, Any]]:
        request_id = _request_id(reply)
        yield {
            "type": "interaction",
            "request_id": request_id,
            "session_id": f"oasst-{self.tree_id}",
            "user_id": self.user_id,
            "business_line": self.business_line,
            "base_model": reply.get("model_name") or "oasst-human",
            "messages": prompt,
            "response": reply["text"],
            "prompt_hash": prompt_hash(prompt),
            "status": "ok",
            "source": SOURCE,
            "created_at": _iso(self.tick()),
            "metadata": {
                "oasst_message_id": reply["message_id"],
                "oasst_tree_id": self.tree_id,
                "lang": language or reply.get("lang"),
                "synthetic": bool(reply.get("synthetic")),
            },
        }
        emojis = reply.get("emojis") or {}
        for emoji, kind in (("+1", "thumbs_up"), ("-1", "thumbs_down")):
            for index in range(int(emojis.get(emoji, 0))):
                yield {
                    "type": kind,
                    "request_id": request_id,
                    "idempotency_key": f"oasst:{reply['message_id']}:{emoji}:{index}",
                    "created_at": _iso(self.tick()),
                }
        if reply.get("rank") is not None:
            yield {
                "type": "rank",
                "request_id": request_id,
                "rank": int(reply["rank"]),
                "idempotency_key": f"oasst:{reply['message_id']}:rank",
                "created_at": _iso(self.tick()),
            }


def _request_id(message: dict[str, Any]) -> str:
    return f"oasst-{message['message_id']}"


def check_tree(tree: Any) -> None:
    """Raise ``ValueError`` naming the first thing that makes ``tree`` unusable."""
    if not isinstance(tree, dict) or not isinstance(tree.get("prompt"), dict):
        raise ValueError("not an OASST tree: missing object field 'prompt'")
    stack: list[tuple[str, Any]] = [("prompt", tree["prompt"])]
    while stack:
        path, node = stack.pop()
        if not isinstance(node, dict):
            raise ValueError(f"{path} is not an object")
        for name in ("message_id", "text", "role"):
            if not isinstance(node.get(name), str) or not node[name]:
                raise ValueError(f"{path}.{name} is missing or not a string")
        if node["role"] not in ROLE_OF:
            raise ValueError(f"{path}.role {node['role']!r} is not prompter or assistant")
        replies = node.get("replies") or []
        if not isinstance(replies, list):
            raise ValueError(f"{path}.replies is not a list")
        stack.extend((f"{path}.replies.{i}", reply) for i, reply in enumerate(replies))


def oasst_items(
    items: Iterable[JsonlItem], rules: BusinessRules, *, start: datetime = OASST_START
) -> Iterator[IngestItem]:
    """Events of a JSONL file of trees; a line that is not a usable tree comes back malformed."""
    for index, item in enumerate(items):
        if isinstance(item, MalformedLine):
            yield item
            continue
        try:
            check_tree(item.data)
        except ValueError as exc:
            yield MalformedLine(item.line_number, str(exc), item.raw)
            continue
        root = item.data["prompt"]
        if root.get("deleted"):
            continue
        walk = _TreeWalk(item.data, rules, start + timedelta(hours=index))
        yield from walk.events(root, [])
