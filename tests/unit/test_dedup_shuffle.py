"""Dedup over partitions and shards decides exactly as the one-batch path does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from feedback.dedup import DedupInputError, assign_clusters
from feedback.dedup.shuffle import bucket_shard, join_shards, read_meta, sign_partition
from flywheel.settings.cleaning import DedupSettings

WORDS = ["refund", "order", "late", "parcel", "doctor", "fever", "contract", "lease", "tax", "fee"]


def partitioned(
    records: list[dict[str, Any]], parts: int, shards: int, dedup: DedupSettings, staging: Path
) -> list[Any]:
    cuts = [len(records) * k // parts for k in range(parts + 1)]
    offsets = [0]
    for partition in range(parts):
        chunk = records[cuts[partition] : cuts[partition + 1]]
        sign_partition(
            chunk,
            field="text",
            settings=dedup,
            staging=staging,
            partition=partition,
            shards=shards,
        )
        offsets.append(offsets[-1] + len(chunk))
    edges = [bucket_shard(staging, shard, offsets, dedup) for shard in range(shards)]
    return join_shards(read_meta(staging, parts), edges, dedup)


record_strategy = st.fixed_dictionaries(
    {
        "words": st.lists(st.sampled_from(WORDS), min_size=0, max_size=8),
        "signal": st.sampled_from(["thumbs_up", "thumbs_down"]),
        "business_line": st.sampled_from(["legal", "medical"]),
        "minute": st.integers(0, 30),
        "missing": st.booleans(),
    }
)


def as_record(raw: dict[str, Any]) -> dict[str, Any]:
    return {
        "text": None if raw["missing"] and not raw["words"] else " ".join(raw["words"]),
        "signal": raw["signal"],
        "business_line": raw["business_line"],
        "created_at": f"2026-11-01T00:{raw['minute']:02d}:00Z",
    }


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    raws=st.lists(record_strategy, min_size=0, max_size=60),
    parts=st.integers(1, 4),
    shards=st.integers(1, 3),
    flood_cap=st.sampled_from([1, 2]),
)
def test_partitions_decide_like_one_batch(
    tmp_path_factory: pytest.TempPathFactory,
    raws: list[dict[str, Any]],
    parts: int,
    shards: int,
    flood_cap: int,
) -> None:
    records = [as_record(raw) for raw in raws]
    dedup = DedupSettings(threshold=0.5, max_kept_per_cluster=flood_cap)
    staging = tmp_path_factory.mktemp("staging")
    assert partitioned(records, parts, shards, dedup, staging) == assign_clusters(
        records, field="text", settings=dedup
    )


def test_near_duplicates_join_across_partitions(tmp_path: Path) -> None:
    base = "my parcel is late again and nobody answers the phone at the depot"
    records = [
        {"text": base, "signal": "thumbs_down", "business_line": "legal", "created_at": 1.0},
        {
            "text": "what is a lease",
            "signal": "thumbs_down",
            "business_line": "legal",
            "created_at": 2.0,
        },
        {
            "text": base + " today",
            "signal": "thumbs_down",
            "business_line": "legal",
            "created_at": 3.0,
        },
        {"text": base, "signal": "thumbs_up", "business_line": "legal", "created_at": 4.0},
    ]
    decisions = partitioned(records, 4, 2, DedupSettings(), tmp_path)
    assert [d.keep for d in decisions] == [True, True, False, True]
    assert decisions[2].reason == "near_duplicate_of:0"


def test_pairs_are_refused(tmp_path: Path) -> None:
    with pytest.raises(DedupInputError, match="pair_id"):
        sign_partition(
            [{"text": "a", "pair_id": "p1"}],
            field="text",
            settings=DedupSettings(),
            staging=tmp_path,
            partition=0,
            shards=1,
        )
