"""``flywheel adapters fetch`` against real MLflow, run as vLLM's resolver runs it: a
subprocess whose stdout is the verified folder alone, or one line on stderr and its code.

The local SQLite store, and a real ``mlflow server`` with proxied artifacts (the replica
sees no file of the trainer's: the trainer's adapter folder is deleted once registered).
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

import pytest

from flywheel.settings import load_settings
from registry.delivery import TAG_ADAPTER_DIGEST, TAG_BASE_DIGEST, adapter_digest
from registry.tracking import Registry
from tests.integration.test_mlflow_registry import mlflow_server  # noqa: F401  (fixture)
from tests.registered import register_version
from training.base_model import base_fingerprint, write_base_record

pytestmark = pytest.mark.integration

LINE = "customer_service"


@dataclass
class Finished:
    returncode: int
    stdout: str
    stderr: str


def fetch(home: Path, *args: str, tracking_uri: str | None = None) -> Finished:
    """``flywheel adapters fetch`` in a subprocess on ``home``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLYWHEEL_")}
    env.update({"FLYWHEEL_HOME": str(home), "MLFLOW_DISABLE_TELEMETRY": "true"})
    if tracking_uri is not None:
        env["FLYWHEEL_MLFLOW_TRACKING_URI"] = tracking_uri
    command = Path(sys.executable).with_name("flywheel")
    done = subprocess.run(
        [str(command), "adapters", "fetch", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )
    return Finished(done.returncode, done.stdout, done.stderr)


def _base(folder: Path, hidden: int) -> Path:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": hidden}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}).encode()
    (folder / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + bytes(16))
    return folder


def _trained_adapter(folder: Path, base: Path) -> Path:
    """An adapter folder as training leaves it: peft's files and the base it was trained on."""
    folder.mkdir(parents=True)
    (folder / "adapter_config.json").write_text(json.dumps({"r": 8, "peft_type": "LORA"}))
    (folder / "adapter_model.safetensors").write_bytes(os.urandom(4096))
    write_base_record(folder, base_fingerprint(base))
    return folder


def _artifact_folder(registry: Registry, version: int) -> Path:
    location = registry.adapter_source(LINE, version)
    return Path(url2pathname(urlparse(location).path))


def _single_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FLYWHEEL_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    monkeypatch.delenv("FLYWHEEL_MLFLOW_TRACKING_URI", raising=False)
    return tmp_path / "home"


def test_a_version_is_fetched_verified_and_a_corrupted_artifact_refused(
    home: Path, tmp_path: Path
) -> None:
    settings = load_settings()
    registry = Registry.for_home(home)
    served = _base(tmp_path / "models" / "SmolLM2-135M-Instruct", hidden=64)
    trained = _trained_adapter(tmp_path / "trainer" / "adapter", served)
    version = register_version(settings, registry, LINE, trained, tmp_path)
    tags = registry.version_tags(LINE, version)
    assert tags[TAG_ADAPTER_DIGEST] == adapter_digest(trained)
    assert tags[TAG_BASE_DIGEST] == base_fingerprint(served).digest
    shutil.rmtree(trained)
    cache = tmp_path / "replica-cache"

    done = fetch(home, f"{LINE}-v{version}", "--cache", str(cache), "--served-base", str(served))

    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{cache / f'{LINE}-v{version}'}\n"
    folder = Path(done.stdout.strip())
    assert adapter_digest(folder) == tags[TAG_ADAPTER_DIGEST]
    assert sorted(p.name for p in cache.iterdir()) == [f"{LINE}-v{version}"]

    # One byte changed in the artifact store: refused by its digest, the cache left clean.
    weights = _artifact_folder(registry, version) / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0x01
    weights.write_bytes(bytes(data))
    other_cache = tmp_path / "other-replica-cache"
    refused = fetch(home, f"{LINE}-v{version}", "--cache", str(other_cache))
    assert refused.returncode == 8, refused.stderr
    assert refused.stdout == ""
    line = _single_line(refused.stderr)
    assert tags[TAG_ADAPTER_DIGEST] in line
    assert adapter_digest(weights.parent) in line
    assert list(other_cache.iterdir()) == []
    # The copy already verified in the first replica's cache is still served.
    assert fetch(home, f"{LINE}-v{version}", "--cache", str(cache)).returncode == 0


def test_another_base_a_rolled_back_version_and_bad_names_are_refused(
    home: Path, tmp_path: Path
) -> None:
    settings = load_settings()
    registry = Registry.for_home(home)
    trained_on = _base(tmp_path / "models" / "SmolLM2-135M-Instruct", hidden=64)
    served = _base(tmp_path / "models" / "Qwen2.5-0.5B-Instruct", hidden=896)
    version = register_version(
        settings, registry, LINE, _trained_adapter(tmp_path / "a", trained_on), tmp_path
    )
    cache = tmp_path / "cache"

    other_base = fetch(
        home, f"{LINE}-v{version}", "--cache", str(cache), "--served-base", str(served)
    )
    assert other_base.returncode == 8
    assert other_base.stdout == ""
    reason = _single_line(other_base.stderr)
    assert "trained on SmolLM2-135M-Instruct (sha256:" in reason
    assert "this replica serves Qwen2.5-0.5B-Instruct (sha256:" in reason

    registry.reject(LINE, version, "the canary's satisfaction fell")
    rolled_back = fetch(home, f"{LINE}-v{version}", "--cache", str(cache))
    assert rolled_back.returncode == 8
    assert "rolled back (the canary's satisfaction fell)" in _single_line(rolled_back.stderr)

    unknown = fetch(home, f"{LINE}-v99", "--cache", str(cache))
    assert unknown.returncode == 2
    assert "has no version 99" in _single_line(unknown.stderr)
    malformed = fetch(home, "not an adapter", "--cache", str(cache))
    assert malformed.returncode == 2
    assert "is not a flywheel adapter name" in _single_line(malformed.stderr)
    no_base = fetch(home, f"{LINE}-v{version}", "--cache", str(cache), "--served-base", "/nope")
    assert no_base.returncode == 2
    assert "--served-base" in _single_line(no_base.stderr)


@pytest.mark.slow
def test_a_replica_fetches_through_a_tracking_server_with_proxied_artifacts(
    mlflow_server: str,  # noqa: F811
    home: Path,
    tmp_path: Path,
) -> None:
    settings = load_settings()
    registry = Registry(mlflow_server, None, download_dir=tmp_path / "trainer-downloads")
    base = _base(tmp_path / "models" / "SmolLM2-135M-Instruct", hidden=64)
    trained = _trained_adapter(tmp_path / "trainer" / "adapter", base)
    version = register_version(settings, registry, LINE, trained, tmp_path)
    digest = adapter_digest(trained)
    shutil.rmtree(trained)
    assert registry.adapter_source(LINE, version).startswith("mlflow-artifacts:")
    replica_home = tmp_path / "replica-home"
    cache = replica_home / "adapters"

    done = fetch(
        replica_home,
        f"{LINE}-v{version}",
        "--cache",
        str(cache),
        "--served-base",
        str(base),
        tracking_uri=mlflow_server,
    )

    assert done.returncode == 0, done.stderr
    assert adapter_digest(Path(done.stdout.strip())) == digest
    # The server's copy corrupted: a second replica refuses it.
    [stored] = (tmp_path / "server-artifacts").rglob("adapter_model.safetensors")
    stored.write_bytes(b"\0" + stored.read_bytes()[1:])
    refused = fetch(
        replica_home,
        f"{LINE}-v{version}",
        "--cache",
        str(replica_home / "second"),
        tracking_uri=mlflow_server,
    )
    assert refused.returncode == 8, refused.stderr
    assert digest in _single_line(refused.stderr)
    assert list((replica_home / "second").iterdir()) == []
