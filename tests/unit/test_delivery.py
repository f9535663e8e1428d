"""Adapter delivery: the digest, the base fingerprint and refusal, the fetch into a cache."""

from __future__ import annotations

import json
import shutil
import struct
import time
from pathlib import Path

import pytest

from flywheel.errors import FlywheelError
from flywheel.settings import Settings
from registry.delivery import (
    TAG_ADAPTER_DIGEST,
    AdapterDigestError,
    adapter_digest,
    base_refusal,
    delivery_tags,
    fetch_adapter,
    recorded_base,
)
from training.base_model import (
    BASE_RECORD,
    BaseFingerprint,
    base_fingerprint,
    read_base_record,
    write_base_record,
)


def _adapter(folder: Path, payload: bytes = b"weights") -> Path:
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(payload * 64)
    return folder


def _safetensors(path: Path, header: dict[str, object], data: bytes) -> None:
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)


def _base(folder: Path, *, hidden: int = 64, data: bytes = b"\x01" * 4096) -> Path:
    folder.mkdir(parents=True)
    config = {"_name_or_path": str(folder), "hidden_size": hidden, "model_type": "llama"}
    (folder / "config.json").write_text(json.dumps(config))
    header = {"w": {"dtype": "F32", "shape": [hidden, 16], "data_offsets": [0, len(data)]}}
    _safetensors(folder / "model.safetensors", header, data)
    return folder


# --------------------------------------------------------------------------- adapter digest


def test_the_digest_covers_names_sizes_and_bytes_in_a_stable_order(tmp_path: Path) -> None:
    folder = _adapter(tmp_path / "a")
    (folder / "sub").mkdir()
    (folder / "sub" / "extra.json").write_text("{}")
    digest = adapter_digest(folder)
    assert digest.startswith("sha256:")
    assert len(digest) == len("sha256:") + 64

    copy = tmp_path / "copy"
    shutil.copytree(folder, copy)
    assert adapter_digest(copy) == digest

    (copy / "adapter_model.safetensors").write_bytes(b"weightz" * 64)
    assert adapter_digest(copy) != digest
    shutil.rmtree(copy)
    shutil.copytree(folder, copy)
    (copy / "sub" / "extra.json").rename(copy / "sub" / "other.json")
    assert adapter_digest(copy) != digest
    # Moving bytes from one file's end to the next file's start changes it too.
    shutil.rmtree(copy)
    shutil.copytree(folder, copy)
    (copy / "adapter_config.json").write_text((folder / "adapter_config.json").read_text() + "x")
    assert adapter_digest(copy) != digest


def test_the_digest_of_a_missing_folder_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FlywheelError, match="is not a folder"):
        adapter_digest(tmp_path / "nothing")


# --------------------------------------------------------------------------- base fingerprint


def test_the_base_fingerprint_is_its_config_and_weights_layout_wherever_it_lies(
    tmp_path: Path,
) -> None:
    one = base_fingerprint(_base(tmp_path / "host-a" / "SmolLM2-135M-Instruct"))
    two = base_fingerprint(_base(tmp_path / "host-b" / "SmolLM2-135M-Instruct"))
    assert one == two
    assert one.name == "SmolLM2-135M-Instruct"
    assert one.digest.startswith("sha256:")

    wider = base_fingerprint(_base(tmp_path / "wider" / "SmolLM2-135M-Instruct", hidden=128))
    assert wider.digest != one.digest
    # Same architecture, other weights (a fine-tune): its first MB of weights tells them apart.
    tuned = base_fingerprint(_base(tmp_path / "tuned" / "x", data=b"\x02" * 4096))
    assert tuned.digest != one.digest


def test_the_base_name_is_a_hub_name_from_the_config_when_it_has_one(tmp_path: Path) -> None:
    folder = _base(tmp_path / "local-copy")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(
        json.dumps({**config, "_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct"})
    )
    fingerprint = base_fingerprint(folder)
    assert fingerprint.name == "HuggingFaceTB/SmolLM2-135M-Instruct"
    # The name it was saved under is no part of the digest.
    assert fingerprint.digest == base_fingerprint(_base(tmp_path / "other")).digest


def test_a_sharded_base_reads_its_index_and_headers_only(tmp_path: Path) -> None:
    folder = tmp_path / "sharded"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama"}))
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors"}}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    big = b"\x03" * (8 << 20)
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        _safetensors(
            folder / shard, {"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, big
        )
    started = time.perf_counter()
    fingerprint = base_fingerprint(folder)
    assert time.perf_counter() - started < 0.5
    index["weight_map"]["b"] = "model-00002-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps(index))
    assert base_fingerprint(folder).digest != fingerprint.digest


def test_a_folder_without_a_config_or_with_a_broken_header_is_a_clear_error(
    tmp_path: Path,
) -> None:
    with pytest.raises(FlywheelError, match=r"no config\.json"):
        base_fingerprint(tmp_path)
    folder = _base(tmp_path / "broken")
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", 10**9) + b"{}")
    with pytest.raises(FlywheelError, match="not a safetensors file"):
        base_fingerprint(folder)


def test_the_base_record_travels_in_the_adapter_and_its_tags(tmp_path: Path) -> None:
    adapter = _adapter(tmp_path / "adapter")
    assert read_base_record(adapter) is None
    base = BaseFingerprint("SmolLM2-135M-Instruct", "sha256:" + "ab" * 32)
    before = adapter_digest(adapter)
    write_base_record(adapter, base)
    assert (adapter / BASE_RECORD).is_file()
    assert read_base_record(adapter) == base
    assert adapter_digest(adapter) != before
    tags = delivery_tags(adapter, adapter_digest(adapter))
    assert recorded_base(tags) == base
    assert recorded_base({"base_model": "SmolLM2-135M-Instruct"}) == BaseFingerprint(
        "SmolLM2-135M-Instruct", ""
    )
    assert recorded_base({}) is None


# --------------------------------------------------------------------------- base refusal

SERVED = BaseFingerprint("SmolLM2-135M-Instruct", "sha256:" + "ef01" * 16)


def test_the_same_base_is_served() -> None:
    assert base_refusal(BaseFingerprint("another name", SERVED.digest), SERVED) is None


def test_another_base_is_refused_naming_both() -> None:
    reason = base_refusal(BaseFingerprint("Qwen2.5-0.5B", "sha256:" + "abcd" * 16), SERVED)
    assert reason is not None
    assert "trained on Qwen2.5-0.5B (sha256:abcdabcdabcd…)" in reason
    assert "this replica serves SmolLM2-135M-Instruct (sha256:ef01ef01ef01…)" in reason


def test_an_older_adapter_without_a_digest_is_checked_by_name_and_says_so() -> None:
    assert base_refusal(BaseFingerprint("SmolLM2-135M-Instruct", ""), SERVED) is None
    reason = base_refusal(BaseFingerprint("Qwen2.5-0.5B", ""), SERVED)
    assert reason is not None
    assert "checked by name only" in reason
    assert base_refusal(None, SERVED) is None


# --------------------------------------------------------------------------- fetch


class _Registry:
    """The registry's two calls a fetch makes, over a folder standing for the artifact store."""

    def __init__(self, store: Path, tags: dict[str, str]) -> None:
        self.store = store
        self.tags = tags
        self.downloads = 0

    def version_tags(self, line: str, version: int) -> dict[str, str]:
        return dict(self.tags)

    def download_adapter(self, line: str, version: int, destination: Path) -> Path:
        self.downloads += 1
        target = destination / "artifacts"
        shutil.copytree(self.store, target)
        return target


def test_a_fetch_lands_verified_in_the_cache_and_is_reused(tmp_path: Path) -> None:
    store = _adapter(tmp_path / "store")
    registry = _Registry(store, {TAG_ADAPTER_DIGEST: adapter_digest(store)})
    cache = tmp_path / "cache"

    folder = fetch_adapter(registry, "legal", 3, cache)  # type: ignore[arg-type]

    assert folder == cache / "legal-v3"
    assert adapter_digest(folder) == adapter_digest(store)
    assert sorted(p.name for p in cache.iterdir()) == ["legal-v3"]
    assert fetch_adapter(registry, "legal", 3, cache) == folder  # type: ignore[arg-type]
    assert registry.downloads == 1


def test_a_corrupted_artifact_is_refused_by_its_digest_and_leaves_nothing(tmp_path: Path) -> None:
    store = _adapter(tmp_path / "store")
    registry = _Registry(store, {TAG_ADAPTER_DIGEST: adapter_digest(store)})
    weights = store / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[10] ^= 0xFF
    weights.write_bytes(bytes(data))
    cache = tmp_path / "cache"

    with pytest.raises(AdapterDigestError) as refused:
        fetch_adapter(registry, "legal", 3, cache)  # type: ignore[arg-type]

    assert refused.value.exit_code == 8
    assert registry.tags[TAG_ADAPTER_DIGEST] in str(refused.value)
    assert adapter_digest(store) in str(refused.value)
    assert list(cache.iterdir()) == []


def test_a_cache_entry_changed_on_disk_is_fetched_again(tmp_path: Path) -> None:
    store = _adapter(tmp_path / "store")
    registry = _Registry(store, {TAG_ADAPTER_DIGEST: adapter_digest(store)})
    cache = tmp_path / "cache"
    folder = fetch_adapter(registry, "legal", 3, cache)  # type: ignore[arg-type]
    (folder / "adapter_model.safetensors").write_bytes(b"tampered")

    again = fetch_adapter(registry, "legal", 3, cache)  # type: ignore[arg-type]

    assert registry.downloads == 2
    assert adapter_digest(again) == adapter_digest(store)


def test_a_version_from_before_digests_is_fetched_unchecked(tmp_path: Path) -> None:
    store = _adapter(tmp_path / "store")
    registry = _Registry(store, {})
    folder = fetch_adapter(registry, "legal", 1, tmp_path / "cache")  # type: ignore[arg-type]
    assert (folder / "adapter_config.json").is_file()


def test_files_without_an_adapter_config_are_no_adapter(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "README.md").write_text("not an adapter")
    registry = _Registry(store, {TAG_ADAPTER_DIGEST: adapter_digest(store)})
    with pytest.raises(FlywheelError, match=r"adapter_config\.json"):
        fetch_adapter(registry, "legal", 1, tmp_path / "cache")  # type: ignore[arg-type]
    assert list((tmp_path / "cache").iterdir()) == []


# --------------------------------------------------------------------------- the registry's paths


def test_the_registry_hands_vllm_only_checked_folders(
    settings: Settings, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from registry.tracking import Registry, artifact_root_for, tracking_uri_for
    from tests.registered import register_version

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    home = settings.home
    cached = Registry.for_home(home)
    version = register_version(settings, cached, "legal", _adapter(tmp_path / "trained"), tmp_path)
    in_place = Registry(tracking_uri_for(home, None), artifact_root_for(home))

    folder = cached.adapter_path("legal", version)
    assert folder == home / "mlflow" / "downloads" / f"legal-v{version}"
    stored = in_place.adapter_path("legal", version)
    assert stored != folder
    assert adapter_digest(stored) == adapter_digest(folder)

    (stored / "adapter_model.safetensors").write_bytes(b"changed")
    with pytest.raises(AdapterDigestError, match="not the registered"):
        in_place.adapter_path("legal", version)
    # The copy verified before is still whole; a new fetch of the changed store is refused.
    assert cached.adapter_path("legal", version) == folder
    shutil.rmtree(folder)
    with pytest.raises(AdapterDigestError):
        cached.adapter_path("legal", version)
    assert not folder.exists()
