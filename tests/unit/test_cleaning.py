"""The cleaning stage's own logic, with a stand-in scrubber (the real one has its own tests)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from feedback.cleaning import clean_records, drop_reason
from feedback.records import FeedbackRecord
from flywheel.settings.cleaning import CleaningSettings

SECRET = re.compile(r"SECRET\d+")


def fake_scrub(batch: list[FeedbackRecord]) -> list[FeedbackRecord]:
    out = []
    for record in batch:
        found = sum(len(SECRET.findall(m["content"])) for m in record.messages)
        out.append(
            record.scrubbed(
                messages=[
                    {**m, "content": SECRET.sub("<PERSON_1>", m["content"])}
                    for m in record.messages
                ],
                response=SECRET.sub("<PERSON_1>", record.response),
                edit=record.edit,
                pii={"PERSON": found} if found else {},
            )
        )
    return out


def rec(rid: str, prompt: str, response: str, signal: str, **extra: Any) -> FeedbackRecord:
    feedback = [{"id": len(rid), "type": signal, "rank": None}] if signal != "none" else []
    return FeedbackRecord.from_dict(
        {
            "request_id": rid,
            "user_id": extra.get("user_id", f"user-{rid}"),
            "business_line": "legal",
            "adapter_name": None,
            "base_model": "base",
            "messages": [{"role": "user", "content": prompt}],
            "response": response,
            "prompt_hash": extra.get("prompt_hash", rid),
            "status": extra.get("status", "ok"),
            "created_at": f"2026-11-01T00:{len(rid):02d}:00Z",
            "feedback": feedback,
            "edit": extra.get("edit"),
            "signal": signal,
        }
    )


def test_drop_reasons() -> None:
    assert (
        drop_reason(
            replace(
                rec("a", "SECRET1", "x", "none"),
                messages=({"role": "user", "content": "<PERSON_1>"},),
            ),
            4,
        )
        == "pii_only"
    )
    assert drop_reason(rec("a", "hello there", "", "none"), 4) == "failed_request"
    assert drop_reason(rec("a", "hello there", "x", "none", status="error"), 4) == "failed_request"
    assert drop_reason(rec("a", "?!", "x", "none"), 4) == "empty_prompt"
    assert drop_reason(rec("a", "Can I sue my landlord?", "x", "none"), 4) is None


def test_funnel_counts_each_step_and_reason(tmp_path: Path) -> None:
    records = [
        rec(
            "keep1",
            "My landlord keeps the deposit, SECRET1 says.",
            "Write to them first.",
            "thumbs_up",
        ),
        rec(
            "dup1",
            "My landlord keeps the deposit, SECRET2 says.",
            "Write to them first.",
            "thumbs_up",
        ),
        rec("only", "SECRET3", "Hello.", "thumbs_down"),
        rec("fail", "Can I break my lease?", "", "none", status="error"),
        rec("neg", "Is a verbal contract valid?", "No idea.", "thumbs_down"),
    ]
    result = clean_records(
        records,
        "legal",
        scrub=fake_scrub,
        settings=CleaningSettings(),
        dataset_root=tmp_path,
        source={"records": len(records)},
    )
    funnel = result.funnel.as_dict()
    assert funnel["steps"]["pulled"] == {"none": 1, "thumbs_down": 2, "thumbs_up": 2}
    assert funnel["steps"]["filtered"] == {"thumbs_down": 1, "thumbs_up": 2}
    assert funnel["steps"]["deduplicated"] == {"thumbs_down": 1, "thumbs_up": 1}
    assert funnel["dropped"] == {"exact_duplicate": 1, "failed_request": 1, "pii_only": 1}
    assert funnel["pii"] == {"PERSON": 3}
    assert result.dataset is not None
    text = "".join(p.read_bytes().decode("latin-1") for p in result.dataset.path.iterdir())
    assert "SECRET" not in text
    counts = result.dataset.manifest["counts"]
    assert counts["sft"]["train"] + counts["sft"]["eval"] == 1
    rules = sorted(e["rule"] for e in result.dataset.manifest["examples"] if e["kind"] == "kto")
    assert rules == ["thumbs_down", "thumbs_up"]  # the negative survives as a KTO label


def test_dedup_first_scrubs_only_what_passes_the_cheap_filters(tmp_path: Path) -> None:
    scrubbed: list[str] = []

    def counting_scrub(batch: list[FeedbackRecord]) -> list[FeedbackRecord]:
        scrubbed.extend(record.request_id for record in batch)
        return fake_scrub(batch)

    records = [
        rec("a", "My landlord keeps the deposit, SECRET1 says.", "Write first.", "thumbs_up"),
        rec("bb", "My landlord keeps the deposit, SECRET1 says.", "Write first.", "thumbs_up"),
        rec("ccc", "My landlord keeps the deposit, SECRET2 says.", "Write first.", "thumbs_up"),
        rec("dddd", "Can I break my lease?", "", "none", status="error"),
        # Same raw text as "f" but earlier, though pulled after it: both are scrubbed.
        replace(
            rec("eeeee", "SECRET4", "Hello.", "thumbs_down"), created_at="2026-11-01T00:09:00Z"
        ),
        replace(
            rec("ffffff", "SECRET4", "Hello.", "thumbs_down"), created_at="2026-11-01T00:08:00Z"
        ),
        replace(
            rec("ggggggg", "SECRET4", "Hello.", "thumbs_down"), created_at="2026-11-01T00:10:00Z"
        ),
        rec("hhhhhhhh", "Is a verbal contract valid?", "No idea.", "thumbs_down"),
    ]
    funnels = {}
    for order in ("scrub_first", "dedup_first"):
        scrubbed.clear()
        result = clean_records(
            records,
            "legal",
            scrub=counting_scrub,
            settings=CleaningSettings(scrub_order=order),  # type: ignore[arg-type]
            dataset_root=tmp_path / order,
            source={"records": len(records)},
        )
        assert result.dataset is not None
        funnels[order] = (result.funnel.as_dict(), result.dataset.content_hash, list(scrubbed))
    first, dedup_first = funnels["scrub_first"], funnels["dedup_first"]
    assert first[2] == [r.request_id for r in records]
    assert dedup_first[2] == ["a", "ccc", "eeeee", "ffffff", "hhhhhhhh"]
    assert dedup_first[1] == first[1]
    assert dedup_first[0]["steps"] == first[0]["steps"]
    assert dedup_first[0]["dropped"] == first[0]["dropped"]
    assert first[0]["dropped"] == {"exact_duplicate": 2, "failed_request": 1, "pii_only": 3}
    # Only what was scrubbed counts: not the set-aside twin's nor the failed request's PII.
    assert first[0]["pii"] == {"PERSON": 6}
    assert dedup_first[0]["pii"] == {"PERSON": 4}
