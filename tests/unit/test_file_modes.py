"""Files that hold users' text are the owner's alone (0600 files, 0700 folders), under a
permissive umask: the SQLite store and its WAL, the gateway's spool, datasets, MLflow's
local store, log files."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from feedback.cleaning import clean_records
from feedback.records import FeedbackRecord
from feedback.store import FeedbackStore
from flywheel.file_modes import open_private, private_dir
from flywheel.settings import Settings
from flywheel.settings.cleaning import CleaningSettings
from gateway.recorder import Spool


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def permissive_umask() -> Iterator[None]:
    """The usual 022: without explicit modes, files would be 0644 and folders 0755."""
    before = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(before)


def _interaction(request_id: str) -> dict[str, Any]:
    return {
        "type": "interaction",
        "request_id": request_id,
        "user_id": "alice",
        "business_line": "legal",
        "base_model": "base",
        "messages": [{"role": "user", "content": "My landlord keeps the deposit, what now?"}],
        "response": "Write to them first.",
        "created_at": datetime.now(UTC).isoformat(),
    }


def test_the_sqlite_store_and_its_wal_are_owner_only(settings: Settings) -> None:
    store = FeedbackStore.open(settings)
    try:
        store.ingest([_interaction("req-1")], source="test")
        database = settings.home / "flywheel.db"
        wal = database.with_name("flywheel.db-wal")
        shm = database.with_name("flywheel.db-shm")
        assert wal.exists(), "WAL mode is on: the WAL holds the last writes"
        assert shm.exists()
        assert {p.name: _mode(p) for p in (database, wal, shm)} == {
            "flywheel.db": 0o600,
            "flywheel.db-wal": 0o600,
            "flywheel.db-shm": 0o600,
        }
        assert _mode(settings.home) == 0o700
    finally:
        store.close()


def test_an_existing_world_readable_store_is_tightened(settings: Settings) -> None:
    FeedbackStore.open(settings).close()
    database = settings.home / "flywheel.db"
    database.chmod(0o644)
    FeedbackStore.open(settings).close()
    assert _mode(database) == 0o600


def test_spool_files_and_folders_are_owner_only(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "spool" / "gateway")
    batch = spool.append([_interaction("req-1")])
    waiting = Spool(spool.directory / "waiting").append([_interaction("req-2")])
    assert _mode(batch) == 0o600
    assert _mode(waiting) == 0o600
    for folder in (tmp_path / "spool", spool.directory, waiting.parent):
        assert _mode(folder) == 0o700, folder


def test_dataset_folders_and_files_are_owner_only(tmp_path: Path) -> None:
    records = [
        FeedbackRecord.from_dict(
            {
                "request_id": f"req-{i}",
                "user_id": f"user-{i}",
                "business_line": "legal",
                "adapter_name": None,
                "base_model": "base",
                "messages": [{"role": "user", "content": f"Question number {i} about my lease?"}],
                "response": f"Answer {i}.",
                "prompt_hash": f"p{i}",
                "status": "ok",
                "created_at": f"2026-11-01T00:0{i}:00Z",
                "feedback": [{"id": i, "type": "thumbs_up", "rank": None}],
                "edit": None,
                "signal": "thumbs_up",
            }
        )
        for i in range(4)
    ]
    root = tmp_path / "datasets"
    result = clean_records(
        records,
        "legal",
        scrub=lambda batch: [replace(r, pii={}) for r in batch],
        settings=CleaningSettings(),
        dataset_root=root,
        source={"records": len(records)},
    )
    assert result.dataset is not None
    files = list(result.dataset.path.iterdir())
    assert {p.suffix for p in files} == {".parquet", ".json"}
    assert {p.name: _mode(p) for p in files} == {p.name: 0o600 for p in files}
    for folder in (root, root / "legal", result.dataset.path):
        assert _mode(folder) == 0o700, folder


def test_the_local_mlflow_store_is_owner_only(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from registry.tracking import Registry

    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    registry = Registry.for_home(settings.home)
    registry.experiment_id("legal")
    folder = settings.home / "mlflow"
    assert _mode(folder) == 0o700
    assert _mode(folder / "mlflow.db") == 0o600


def test_log_files_and_private_helpers_ignore_the_umask(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "nested" / "vllm-8000.log"
    private_dir(log.parent)
    log.write_bytes(b"")  # a file someone made 0644 first
    os.close(open_private(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND))
    assert _mode(log) == 0o600
    assert _mode(tmp_path / "logs") == 0o700
    assert _mode(log.parent) == 0o700


def test_a_home_that_cannot_be_used_is_a_settings_error_naming_it(tmp_path: Path) -> None:
    from flywheel.errors import InvalidSettingsError
    from flywheel.file_modes import private_home

    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    with pytest.raises(InvalidSettingsError, match=r"FLYWHEEL_HOME=.*a-file: is a file"):
        private_home(blocker)
    with pytest.raises(InvalidSettingsError, match=r"FLYWHEEL_HOME=.*cannot be made a folder"):
        private_home(blocker / "home")
    assert _mode(private_home(tmp_path / "new" / "home")) == 0o700
    if os.geteuid() == 0:
        return  # root writes anywhere: the permission case needs another user
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    with pytest.raises(InvalidSettingsError, match="cannot write in it"):
        private_home(locked)
