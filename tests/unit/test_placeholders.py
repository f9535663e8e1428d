"""A training answer holding a placeholder its prompt lacks gets neutral words back (it used
to be dropped: the demo lost 52 customer-service examples so), and the dataset's funnel and
the feedback page count how many were restored."""

from __future__ import annotations

from typing import Any

import pytest

from feedback.cleaning import Funnel, build_splits
from feedback.placeholders import NEUTRAL_WORDS, neutral_words
from feedback.records import FeedbackRecord
from flywheel.settings.cleaning import DatasetSettings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<PERSON_1> will call you back.", "The customer will call you back."),
        (
            "Please tell <PERSON_1> the parcel is late.",
            "Please tell the customer the parcel is late.",
        ),
        ("Hi <PERSON_1>, your order ships today.", "Hi, your order ships today."),
        ("Thanks, <PERSON_1>!", "Thanks!"),
        ("Hello <PERSON_1> and welcome back.", "Hello there and welcome back."),
        (
            "Dear <PERSON_1>,\nyour refund is on its way.",
            "Dear customer,\nyour refund is on its way.",
        ),
        ("I'm <PERSON_1>, happy to help.", "I'm your assistant, happy to help."),
        (
            "Write to <EMAIL_ADDRESS_1> or call <PHONE_NUMBER_2>.",
            "Write to the email address or call the phone number.",
        ),
        ("We charged <CREDIT_CARD_1> today.", "We charged the card number today."),
        (
            "您好，<PERSON_1>！请拨打<PHONE_NUMBER_1>联系我们。",
            "您好，客户！请拨打该电话号码联系我们。",
        ),
        ("我是<PERSON_1>，很高兴为您服务。", "我是您的助手，很高兴为您服务。"),
        ("Quote <EMPLOYEE_ID_1> when you call.", "Quote those details when you call."),
    ],
)
def test_each_placeholder_gets_a_neutral_word(text: str, expected: str) -> None:
    restored, count = neutral_words(text)
    assert restored == expected
    assert count == text.count("<")


def test_placeholders_to_keep_stay() -> None:
    text = "Sorry <PERSON_1>, <PERSON_2> will call you."
    assert neutral_words(text, keep={"<PERSON_1>"}) == (
        "Sorry <PERSON_1>, the customer will call you.",
        1,
    )
    assert neutral_words("No placeholder here.") == ("No placeholder here.", 0)


def test_every_scrubbed_type_has_words_in_both_languages() -> None:
    from flywheel.settings.scrubber import SUPPORTED_ENTITIES

    assert set(NEUTRAL_WORDS) == set(SUPPORTED_ENTITIES)
    assert all(english and chinese for english, chinese in NEUTRAL_WORDS.values())


def _record(rid: str, response: str, signal: str, **extra: Any) -> FeedbackRecord:
    return FeedbackRecord.from_dict(
        {
            "request_id": rid,
            "user_id": f"user-{rid}",
            "business_line": "customer_service",
            "adapter_name": "customer_service-v1",
            "base_model": "base",
            "messages": extra.pop("messages", [{"role": "user", "content": "Where is my parcel?"}]),
            "response": response,
            "prompt_hash": f"p-{rid}",
            "created_at": f"2026-11-01T00:00:{len(rid):02d}Z",
            "feedback": [{"id": len(rid), "rank": None, "type": signal}],
            "edit": extra.pop("edit", None),
            "signal": signal,
            **extra,
        }
    )


def test_the_funnel_counts_restored_examples() -> None:
    records = [
        _record("a", "Hi <PERSON_1>, it ships today.", "thumbs_up"),
        _record("bb", "It ships today.", "thumbs_up"),
        _record("ccc", "No.", "edit", edit="Ask <PERSON_1> at the desk."),
    ]
    funnel = Funnel()
    splits = build_splits(records, DatasetSettings(eval_fraction=0.0), funnel)
    sft = [e.completion for by_split in splits["sft"].values() for e in by_split]
    assert sorted(c or "" for c in sft) == [
        "Ask the customer at the desk.",
        "Hi, it ships today.",
        "It ships today.",
    ]
    assert funnel.as_dict()["restored"] == {"dpo": 1, "kto": 1, "sft": 2}
    assert not any(key.startswith("placeholder") for key in funnel.dropped)


def test_the_page_shows_how_many_were_restored() -> None:
    from dashboard import plots
    from dashboard.app import _templates
    from dashboard.lineage import DatasetBuild, restored_examples
    from dashboard.pages import funnel_dict

    funnel = {"steps": {"pulled": {"thumbs_up": 3}}, "restored": {"sft": 2, "dpo": 1, "kto": 0}}
    assert restored_examples(funnel) == [
        ("dpo examples: placeholder in the answer given a neutral word", 1),
        ("sft examples: placeholder in the answer given a neutral word", 2),
    ]
    assert restored_examples({}) == []
    build = DatasetBuild("abc123", "2026-12-04T00:00:00Z", funnel, {}, {}, {})
    html = (
        _templates()
        .get_template("funnel.html")
        .render(plots=plots, builds=[build], business_line="customer_service", tab="funnel")
    )
    assert "Kept with neutral words" in html
    assert "sft examples: placeholder in the answer given a neutral word</td><td>2<" in html
    assert funnel_dict(build)["restored"] == [
        {"what": "dpo examples: placeholder in the answer given a neutral word", "examples": 1},
        {"what": "sft examples: placeholder in the answer given a neutral word", "examples": 2},
    ]


def test_a_pair_is_not_made_the_same_by_its_neutral_words() -> None:
    from feedback.examples import Lineage, TrainingExample, restore_placeholder_targets

    lineage = Lineage(("r1",), (1,), ("v1",), "customer_service", "2026-11-01T00:00:00Z", ())
    prompt = [{"role": "user", "content": "Who can help me?"}]
    pair = TrainingExample(
        "dpo", prompt, lineage, chosen="Ask <PERSON_1>.", rejected="Ask <PERSON_2>.", rule="r"
    )
    (restored,), counts = restore_placeholder_targets([pair])
    assert (restored.chosen, restored.rejected) == ("Ask the customer.", "Ask <PERSON_2>.")
    assert counts == {"dpo": 1}
