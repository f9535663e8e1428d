"""Key files followed by content on both servers: a key revoked by an edit that keeps the
file's mtime stops working, and a broken file keeps the last good keys with a loud log."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import yaml

from dashboard.access import Gatekeeper
from gateway.keys import KeyFileWatch, key_digest

A, B = "fw-key-a", "fw-key-b"


def _write(path: Path, *tokens: str, keep_mtime: float | None = None) -> None:
    keys = [
        {"name": f"k{i}", "sha256": key_digest(t), "business_lines": ["*"]}
        for i, t in enumerate(tokens)
    ]
    path.write_text(yaml.safe_dump({"keys": keys}))
    if keep_mtime is not None:
        os.utime(path, (keep_mtime, keep_mtime))


def test_a_key_revoked_without_an_mtime_change_stops_working(tmp_path: Path) -> None:
    path = tmp_path / "keys.yaml"
    _write(path, A, B)
    mtime = path.stat().st_mtime
    watch, page = KeyFileWatch(path, min_interval_s=0), Gatekeeper(path)
    ring = watch.current()
    assert ring is not None
    assert ring.authorize(B) is not None
    assert page.authorize(B) is not None
    _write(path, A, keep_mtime=mtime)
    assert path.stat().st_mtime == mtime
    ring = watch.current()
    assert ring is not None
    assert ring.authorize(B) is None
    assert ring.authorize(A) is not None
    page._watch.min_interval_s = 0  # type: ignore[union-attr]
    page._watch._next_read = 0  # type: ignore[union-attr]
    assert page.authorize(B) is None


def test_a_broken_file_keeps_the_last_good_keys_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "keys.yaml"
    _write(path, A)
    watch = KeyFileWatch(path, min_interval_s=0)
    assert watch.current() is not None
    path.write_text("keys:\n  - name: k0\n    sha256: [unclosed\n")
    with caplog.at_level(logging.ERROR):
        ring = watch.current()
        watch.current()  # the same broken version is reported once
    assert ring is not None
    assert ring.authorize(A) is not None
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "keeping the last good keys (1)" in errors[0].getMessage()
    # The page: the same keys, no 500.
    page = Gatekeeper(path)
    assert page.authorize(A) is None  # never parsed here: nobody gets in, the page stays up
    assert not page.open_mode


def test_no_file_is_no_keys(tmp_path: Path) -> None:
    assert KeyFileWatch(tmp_path / "absent.yaml").current() is None
    assert Gatekeeper(tmp_path / "absent.yaml").open_mode


def test_a_huge_key_file_is_never_read_whole(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A key file over the bound is refused by name at the command line, and the running
    servers keep the last good keys (one log line), reading no more than the bound."""
    import gateway.keys as keys_module
    from flywheel.errors import UsageError
    from gateway.keys import KeyRing

    monkeypatch.setattr(keys_module, "MAX_KEY_FILE_BYTES", 4096)
    path = tmp_path / "keys.yaml"
    _write(path, A)
    watch = KeyFileWatch(path, min_interval_s=0)
    assert watch.current() is not None
    with path.open("a") as out:
        out.write("# " + "x" * 10_000 + "\n")
    with caplog.at_level(logging.ERROR):
        ring = watch.current()
        watch.current()
    assert ring is not None
    assert ring.authorize(A) is not None
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "larger than" in caplog.records[0].message
    with pytest.raises(UsageError, match=r"keys\.yaml: larger than"):
        KeyRing.load(path)
