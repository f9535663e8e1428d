"""``lab/bench/pii_bench.py``'s halves and scoring: every PII figure is reported on a half of
each data set that the rules were never tuned on, so the split must be deterministic,
balanced and blind to file order; the goals are read from the held-out half only."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = REPO / "lab" / "bench" / "pii_bench.py"
    spec = importlib.util.spec_from_file_location("pii_bench", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["pii_bench"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _texts(n: int) -> list[str]:
    return [f"post {i}: met Ann Lee at the cafe" for i in range(n)]


def test_a_document_keeps_its_half_whatever_the_order(bench: ModuleType) -> None:
    examples = [bench.Example(text, ()) for text in _texts(400)]
    halves = bench.split_halves(examples)
    reversed_halves = bench.split_halves(examples[::-1])
    tune = {examples[p].text for p in halves["tune"]}
    assert tune == {examples[::-1][p].text for p in reversed_halves["tune"]}
    assert set(halves["tune"]).isdisjoint(halves["heldout"])
    assert sorted(halves["tune"] + halves["heldout"]) == list(range(400))
    # Roughly half each (binomial, 400 draws: 200 +- 3 sigma is 170..230).
    assert 170 <= len(halves["tune"]) <= 230


def test_the_half_is_fixed_by_the_text_alone(bench: ModuleType) -> None:
    # The SHA-256 of "hello" starts with 0x2c (even), of "Ann" with 0x17 (odd): pinned, so
    # that a change of the rule (which would move documents between halves) is noticed.
    import hashlib

    for text in ("hello", "world", "Ann", "张伟今天来了"):
        even = hashlib.sha256(text.encode()).digest()[0] % 2 == 0
        assert bench.half_of(text) == ("tune" if even else "heldout")
    assert bench.half_of("hello") == "tune"
    assert bench.half_of("Ann") == "heldout"
    # Repeated documents fall in the same half: no text is in both.
    assert len({bench.half_of("same text") for _ in range(5)}) == 1


def test_measure_scores_only_the_documents_of_the_half(bench: ModuleType) -> None:
    text_a = "call Ann today"
    text_b = "mail Bob now"
    data = bench.DataSet(
        "toy",
        "toy",
        [
            bench.Example(text_a, (bench.GoldSpan("person", 5, 8, "Ann"),)),
            bench.Example(text_b, (bench.GoldSpan("person", 5, 8, "Bob"),)),
        ],
        "person",
        ("person",),
    )
    # Ann replaced, Bob left; "call" wrongly replaced too.
    scored = [
        bench.Scored([True] * 4 + [False] + [True] * 3 + [False] * 6, "<P> <P> today"),
        bench.Scored([False] * len(text_b), text_b),
    ]
    first = bench.measure(data, scored, [0])
    assert first["person"]["leak"] == 0.0
    assert first["non_pii_kept"] == 0.5  # "call" lost, "today" kept
    second = bench.measure(data, scored, [1])
    assert second["person"]["leak"] == 1.0
    assert second["non_pii_kept"] == 1.0
    assert bench.measure(data, scored, [0, 1])["person"]["spans"] == 2


def test_han_characters_count_one_by_one_as_non_pii_tokens(bench: ModuleType) -> None:
    text = "张伟今天来了"
    example = bench.Example(text, (bench.GoldSpan("PER.NAM", 0, 2, "张伟"),))
    replaced = [True, True, True, False, False, False]  # the name and 今
    kept = bench.tokens_kept([example], [bench.Scored(replaced, "")], ["PER.NAM"])
    assert kept == pytest.approx(3 / 4)


def test_goals_are_read_from_the_held_out_half(bench: ModuleType) -> None:
    def figures(leak: float, kept: float) -> dict[str, object]:
        return {"person": {"leak": leak}, "non_pii_kept": kept}

    sets = {
        "wnut17": {
            "tune": {"ours": figures(0.0, 1.0), "vanilla": figures(0.5, 0.9)},
            "heldout": {"ours": figures(0.2, 0.95), "vanilla": figures(0.4, 0.9)},
        }
    }
    checked = {g["goal"]: g for g in bench.check_goals(sets)}
    leak = checked["English person names leaked (wnut17)"]
    assert (leak["ours"], leak["vanilla"], leak["met"]) == (0.2, 0.4, False)
    assert checked["non-PII tokens kept (wnut17)"]["met"] is True
    # Goals on sets that were not loaded are left out, not failed.
    assert all(g["data_set"] == "wnut17" for g in checked.values())


def test_compare_gives_difference_and_ratio(bench: ModuleType) -> None:
    assert bench.compare(0.1, 0.4) == {"difference": -0.3, "ratio": 0.25}
    assert bench.compare(0.1, 0.0)["ratio"] is None


def test_generated_chinese_sentences_have_their_values_at_the_gold_spans(
    bench: ModuleType,
) -> None:
    examples = bench.load_zh_synth(30, seed=3)
    assert examples == bench.load_zh_synth(30, seed=3)  # the same for the same seed
    types = set()
    for example in examples:
        for span in example.gold:
            assert example.text[span.start : span.end] == span.value
            types.add(span.entity_type)
    assert types == {"PERSON", "PHONE_NUMBER", "CN_RESIDENT_ID", "CREDIT_CARD", "EMAIL_ADDRESS"}
