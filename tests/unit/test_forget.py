"""``flywheel forget`` end to end: gateway traffic on the stand-in vLLM, a dataset built
from it, an adapter registered in MLflow on it, then the forget: no trace of the user in
the store or the rewritten dataset, the adapter tagged, and a late spool replay dropped."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow.parquet as pq
import pytest
from sqlalchemy import select

from cli.commands.privacy import forget_everywhere
from composition.recipes import Recipe, recipe_hash, start_training_run
from feedback.cleaning import clean_line
from feedback.datasets import FORGOTTEN_REWRITES, iter_manifests
from feedback.events import stored_identity
from feedback.examples import user_digest
from feedback.records import FeedbackRecord
from feedback.schema import (
    feedback_table,
    forgotten_users_table,
    interactions_table,
    quarantine_table,
)
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from flywheel.settings.cleaning import CleaningSettings, DatasetSettings
from flywheel.settings.gateway import GatewaySettings
from gateway.app import create_app
from gateway.keys import ApiKey, KeyRing, key_digest
from gateway.recorder import InteractionRecorder, Spool
from registry.records import TAG_FORGOTTEN_USER_DATA, TAG_FORGOTTEN_USER_DATA_AT
from registry.routes import RouteStore
from registry.tracking import Registry
from registry.vllm_server import free_port
from tests.routing import set_champion
from tests.servers import serving
from tests.stub_vllm import StubBehaviour, running_stub

LINE = "customer_service"
KEY = "fw-cs-secret"
CHAMPION = "customer_service-v1"
# An id the gateway hashes (Chinese characters), one with a space, and a plain one.
CHINESE, SPACED, PLAIN = "用户42", "bob smith", "alice"
PROMPTS = {
    CHINESE: ["我的包裹丢了，订单号 ZX-40417 怎么办？", "Where is parcel ZX-40418 going?"],
    SPACED: ["Refund for order QK-55121 please, it arrived broken."],
    PLAIN: ["How do I change the delivery address of order PL-77310?"],
}


def _passthrough(batch: list[FeedbackRecord]) -> list[FeedbackRecord]:
    """No PII in these prompts: the dataset keeps every word, so a leak would show."""
    return [replace(record, pii={}) for record in batch]


@dataclass
class Traffic:
    settings: Settings
    store: FeedbackStore
    request_ids: dict[str, list[str]]


@pytest.fixture
def traffic(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[Traffic]:
    """Every user's prompts through the gateway, each answer given a thumbs-up."""
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    store = FeedbackStore.open(settings)
    set_champion(RouteStore(store.engine), LINE, CHAMPION, actor="test")
    keys = KeyRing([ApiKey(name="cs", sha256=key_digest(KEY), business_lines=(LINE,))])
    request_ids: dict[str, list[str]] = {}
    with running_stub(StubBehaviour(adapters={CHAMPION})) as stub:
        config = GatewaySettings(
            upstreams=(stub.base_url,), routes_refresh_s=0.05, log_flush_s=0.02
        )
        app = create_app(settings, config, store=store, routes=RouteStore(store.engine), keys=keys)
        with (
            serving(app, free_port()) as url,
            httpx.Client(
                base_url=url, headers={"Authorization": f"Bearer {KEY}"}, timeout=10
            ) as client,
        ):
            for user, prompts in PROMPTS.items():
                for prompt in prompts:
                    body = {"model": LINE, "messages": [{"role": "user", "content": prompt}]}
                    answer = client.post("/v1/chat/completions", json=body | {"user": user})
                    assert answer.status_code == 200, answer.text
                    request_id = answer.headers["x-request-id"]
                    request_ids.setdefault(user, []).append(request_id)
                    liked = client.post(
                        "/v1/feedback", json={"request_id": request_id, "type": "thumbs_up"}
                    )
                    assert liked.status_code == 202, liked.text
            assert app.state.gateway.recorder.flush(10)
    yield Traffic(settings, store, request_ids)
    store.close()


def _build_dataset(traffic: Traffic) -> Path:
    result = clean_line(
        traffic.store.engine,
        LINE,
        scrub=_passthrough,
        # No per-user cap: every prompt of the user reaches the dataset.
        settings=CleaningSettings(datasets=DatasetSettings(max_user_share=1.0)),
        dataset_root=traffic.settings.datasets_dir,
    )
    assert result.dataset is not None
    return result.dataset.path


def _register(registry: Registry, dataset: Path, tmp_path: Path) -> tuple[str, int]:
    """An adapter version trained (in name only) on ``dataset``, as the nightly flow logs it."""
    manifest = orjson.loads((dataset / "manifest.json").read_bytes())
    recipe = Recipe(business_line=LINE, method="kto", max_steps=1)
    run_id = start_training_run(
        registry, recipe, manifest["content_hash"], dataset / "manifest.json", "base", "abc1234"
    )
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    registry.log_adapter(run_id, adapter)
    lineage = {
        "base_model": "base",
        "dataset_hash": manifest["content_hash"],
        "recipe_hash": recipe_hash(recipe),
        "code_version": "abc1234",
    }
    version = registry.register_adapter(run_id, LINE, lineage)
    registry.finish_run(run_id)
    return run_id, version


def _everything_in(root: Path) -> str:
    """Every file under ``root`` as text: raw bytes (manifests) and decoded parquet rows
    (their pages are compressed, so raw bytes alone would hide a leak)."""
    texts = []
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        texts.append(path.read_bytes().decode("utf-8", "replace"))
        if path.suffix == ".parquet":
            texts.append(json.dumps(pq.read_table(path).to_pylist(), ensure_ascii=False))
    return "\n".join(texts)


def _stored_users(store: FeedbackStore) -> set[str | None]:
    with store.engine.connect() as connection:
        interactions = connection.execute(select(interactions_table.c.user_id)).scalars()
        feedback = connection.execute(select(feedback_table.c.user_id)).scalars()
        return set(interactions) | set(feedback)


def test_forget_by_raw_chinese_id_leaves_no_trace_and_tags_the_adapter(
    traffic: Traffic, tmp_path: Path
) -> None:
    hashed = stored_identity(CHINESE)
    assert hashed is not None
    assert hashed.startswith("h-")
    assert hashed in _stored_users(traffic.store)  # the gateway stored the hashed form
    dataset = _build_dataset(traffic)
    before = _everything_in(traffic.settings.datasets_dir)
    assert PROMPTS[CHINESE][0] in before
    assert PROMPTS[PLAIN][0] in before
    assert user_digest(hashed) in before
    registry = Registry.for_home(traffic.settings.home)
    run_id, version = _register(registry, dataset, tmp_path)

    when = datetime(2026, 12, 10, 8, 0, tzinfo=UTC)
    report = forget_everywhere(traffic.settings, traffic.store, CHINESE, lambda: registry, now=when)

    assert report.forms == (CHINESE, hashed)
    assert report.erasure.matched() == [hashed]
    assert report.erasure.total("interactions") == len(PROMPTS[CHINESE])
    assert report.erasure.total("feedback_events") == len(PROMPTS[CHINESE])
    users = _stored_users(traffic.store)
    assert hashed not in users
    assert CHINESE not in users
    assert stored_identity(SPACED) in users
    assert PLAIN in users

    [rewrite] = report.datasets
    assert rewrite.removed > 0
    assert rewrite.new is not None
    assert not dataset.exists(), "the old folder still holds the user's examples"
    after = _everything_in(traffic.settings.datasets_dir)
    for trace in (CHINESE, hashed, user_digest(hashed), *PROMPTS[CHINESE], "ZX-4041"):
        assert trace not in after, trace
    assert PROMPTS[PLAIN][0] in after
    assert PROMPTS[SPACED][0] in after
    [(_, manifest)] = list(iter_manifests(traffic.settings.datasets_dir))
    assert manifest["content_hash"] == rewrite.new_hash
    assert manifest[FORGOTTEN_REWRITES][0]["from"] == rewrite.old_hash
    kept = sum(sum(split.values()) for split in manifest["counts"].values())
    assert kept == len(manifest["examples"]) > 0
    rows = [
        row
        for name in manifest["files"]
        for row in pq.read_table(rewrite.new.path / name).to_pylist()
    ]
    assert sorted(r["example_id"] for r in rows) == sorted(
        e["example_id"] for e in manifest["examples"]
    )

    tags = registry.version_tags(LINE, version)
    assert tags[TAG_FORGOTTEN_USER_DATA] == "true"
    assert tags[TAG_FORGOTTEN_USER_DATA_AT] == "2026-12-10"
    assert CHINESE not in json.dumps(tags, ensure_ascii=False)
    assert hashed not in str(tags)
    assert registry.client.get_run(run_id).data.tags[TAG_FORGOTTEN_USER_DATA] == "true"
    assert report.flagged is not None
    assert report.flagged.versions == [("flywheel-customer_service", version)]

    with traffic.store.engine.connect() as connection:
        recorded = connection.execute(select(forgotten_users_table)).all()
    assert [row.user_key for row in recorded] == [user_digest(hashed)]  # never the id


def test_forget_by_the_hashed_form_and_by_a_plain_id(traffic: Traffic) -> None:
    hashed = stored_identity(SPACED)
    assert hashed is not None
    by_hash = forget_everywhere(traffic.settings, traffic.store, hashed, _no_registry)
    assert by_hash.forms == (hashed,)
    assert by_hash.erasure.total("interactions") == len(PROMPTS[SPACED])
    plain = forget_everywhere(traffic.settings, traffic.store, PLAIN, _no_registry)
    assert plain.erasure.matched() == [PLAIN]
    assert _stored_users(traffic.store) == {stored_identity(CHINESE)}


def _no_registry() -> Registry:
    raise AssertionError("no dataset held the user: MLflow must not be opened")


def _interaction(request_id: str, user: str, created_at: datetime) -> dict[str, Any]:
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": user,
        "business_line": LINE,
        "base_model": "base",
        "messages": [{"role": "user", "content": f"spooled prompt of {request_id}"}],
        "response": "an answer",
        "created_at": created_at.isoformat(),
    }


def test_a_spooled_batch_of_a_forgotten_user_is_dropped_on_replay(
    traffic: Traffic, settings: Settings
) -> None:
    hashed = stored_identity(CHINESE)
    assert hashed is not None
    forgotten_at = datetime.now(UTC)
    earlier = forgotten_at - timedelta(minutes=5)
    spool_dir = settings.home / "spool" / "replay-test"
    # Written while the store was down, before the forget; one record after it (the user
    # came back) and another user's record in the same batch.
    Spool(spool_dir).append(
        [
            _interaction("req-old-1", hashed, earlier),
            {
                "type": "thumbs_up",
                "request_id": "req-old-1",
                "user_id": hashed,
                "idempotency_key": "up:req-old-1",
                "created_at": earlier.isoformat(),
            },
            _interaction("req-other", PLAIN, earlier),
        ]
    )
    Spool(spool_dir / "waiting").append(
        [
            {
                "type": "thumbs_down",
                "request_id": traffic.request_ids[CHINESE][0],
                "user_id": hashed,
                "idempotency_key": "down:late",
                "created_at": earlier.isoformat(),
            }
        ]
    )
    forget_everywhere(settings, traffic.store, CHINESE, _no_registry, now=forgotten_at)
    Spool(spool_dir).append([_interaction("req-new", hashed, forgotten_at + timedelta(seconds=1))])

    recorder = InteractionRecorder(traffic.store, spool_dir, retry_s=0.0)
    recorder.start()
    assert recorder.flush(10)
    recorder.close()

    assert recorder.stats.forgotten == 3
    assert Spool(spool_dir).files() == []
    assert Spool(spool_dir / "waiting").files() == []
    with traffic.store.engine.connect() as connection:
        stored = dict(
            connection.execute(
                select(interactions_table.c.request_id, interactions_table.c.user_id).where(
                    interactions_table.c.request_id.in_(["req-old-1", "req-other", "req-new"])
                )
            ).all()
        )
        feedback_types = connection.execute(select(feedback_table.c.type)).scalars().all()
        quarantined = connection.execute(select(quarantine_table.c.raw)).scalars().all()
    assert stored == {"req-other": PLAIN, "req-new": hashed}
    assert "thumbs_down" not in feedback_types
    assert quarantined == []


def test_the_forget_command_says_which_form_matched(settings: Settings) -> None:
    from typer.testing import CliRunner

    from cli.main import app

    hashed = stored_identity(CHINESE)
    assert hashed is not None
    store = FeedbackStore.open(settings)
    store.ingest([_interaction("req-cli-1", hashed, datetime.now(UTC))], source="test")
    store.close()
    result = CliRunner().invoke(app, ["forget", CHINESE])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert f"stored by the gateway as {hashed} (hashed)" in text
    assert f"found under the hashed id {hashed}" in text
    assert "deleted 1 interactions, 0 feedback events" in text
    assert "no dataset held the user" in text
    again = CliRunner().invoke(app, ["forget", CHINESE])
    assert "no stored record" in again.output
