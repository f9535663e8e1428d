"""A product or model name is not a person: the model naming itself, its maker or the
product it serves must come out of the scrubber as it went in, or training answers teach
``<PERSON_1>``; real people beside those names are still scrubbed."""

from __future__ import annotations

import pytest
from presidio_analyzer import RecognizerResult

from feedback.pii import ScrubberSettings, build_scrubber
from feedback.pii.product_names import (
    BUILT_IN_PRODUCT_NAMES,
    ProductNames,
    deployment_names,
    model_name_forms,
)
from feedback.pii.scrubber import Scrubber
from flywheel.settings import Settings


@pytest.fixture(scope="module")
def scrubber() -> Scrubber:
    """The scrubber a deployment serving Qwen2.5 on a line called ``acme_support`` builds."""
    settings = Settings(
        business_lines=("acme_support",),
        gateway={"base_model_name": "Qwen/Qwen2.5-7B-Instruct"},
        scrubber=ScrubberSettings(product_names=("Claude",)),
    )
    return build_scrubber(settings.scrubber, product_names=deployment_names(settings))


@pytest.mark.parametrize(
    "text",
    [
        "I'm SmolLM, an AI assistant created by Hugging Face.",
        "Hello! I am SmolLM2, your helpful assistant.",
        "I am Llama, a model trained by Meta.",
        "I'm Qwen, created by Alibaba Cloud.",
        "This is Qwen2.5-7B-Instruct answering.",
        # configured: a product named like a person
        "Hi, I'm Claude, an AI assistant.",
        "我是通义千问，由阿里云开发的助手。",
        "as a Chatbot designed to assist you",
    ],
)
def test_product_and_model_names_are_no_persons(scrubber: Scrubber, text: str) -> None:
    result = scrubber.scrub_text(text)
    assert result.text == text
    assert "PERSON" not in result.summary


def test_people_beside_product_names_are_still_scrubbed(scrubber: Scrubber) -> None:
    text = "I'm SmolLM; John Smith from billing will call you back."
    result = scrubber.scrub_text(text)
    assert "SmolLM" in result.text
    assert "John" not in result.text
    assert "Smith" not in result.text


def test_names_like_people_are_persons_unless_configured() -> None:
    # "Claude" is a given name: only a deployment that serves it lists it.
    assert "Claude" not in BUILT_IN_PRODUCT_NAMES
    plain = build_scrubber(ScrubberSettings(languages=("en",)))
    assert "Claude" not in plain.scrub_text("Hi, I'm Claude, an AI assistant.").text
    assert plain.scrub_text("I'm SmolLM2, an AI assistant.").text == (
        "I'm SmolLM2, an AI assistant."
    )


def test_model_identifiers_give_their_family_names() -> None:
    assert model_name_forms("Qwen/Qwen2.5-7B-Instruct") == {
        "Qwen2.5-7B-Instruct",
        "Qwen2.5",
        "Qwen",
    }
    assert model_name_forms("/models/SmolLM2-135M-Instruct/") >= {"SmolLM2", "SmolLM"}
    assert model_name_forms(" ") == set()


def test_deployment_names_come_from_settings(tmp_path: object) -> None:
    settings = Settings(
        business_lines=("customer_service", "legal"),
        base_model="/srv/models/Acmebot-3B-Chat",
        gateway={"base_model_name": "acme/Acmebot-3B-Chat"},
        scrubber=ScrubberSettings(product_names=("Helpwise",)),
    )
    names = deployment_names(settings)
    assert {"Helpwise", "Acmebot-3B-Chat", "Acmebot", "customer service", "legal"} <= set(names)
    assert len(names) == len(set(names))


def test_a_person_span_loses_only_the_product_name() -> None:
    products = ProductNames(["Qwen", "Hugging Face"])
    text = "Ask Qwen Smith or Hugging Face"
    kept = products.without_products(
        text,
        [
            RecognizerResult("PERSON", 4, 14, 0.8),  # "Qwen Smith"
            RecognizerResult("PERSON", 18, 25, 0.6),  # "Hugging"
            RecognizerResult("EMAIL_ADDRESS", 4, 8, 1.0),  # other types are left alone
        ],
    )
    assert [(text[r.start : r.end], r.entity_type) for r in kept] == [
        ("Smith", "PERSON"),
        ("Qwen", "EMAIL_ADDRESS"),
    ]
    assert products.is_product("qwen")
    assert products.is_product("Hugging Face")
    assert not products.is_product("Qwen Smith")


def test_product_names_in_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="product name"):
        ScrubberSettings(product_names=("  ",))


@pytest.mark.parametrize(
    "text",
    [
        "Open the Settings app, tap Account Security, then tap Reset Password.",
        "I bought the Summit Jacket last week and it already tore.",
        "Tap Forgot Password on the sign-in page.",
    ],
)
def test_words_ending_in_a_thing_are_no_person(scrubber: Scrubber, text: str) -> None:
    """A capitalised phrase after "the", "your" or "tap" whose last word is an English noun no
    name list knows, and whose first word is no name, is a button, a plan or a product."""
    result = scrubber.scrub_text(text)
    assert result.text == text


def test_a_name_whose_family_name_is_a_word_is_still_a_person(scrubber: Scrubber) -> None:
    text = (
        "Please ask Rose Baker, Maria Gonzalez or Jack Sparrow to call me back. "
        "He is like Bubble Boy."
    )
    result = scrubber.scrub_text(text)
    for part in ("Rose", "Baker", "Maria", "Gonzalez", "Jack", "Sparrow", "Bubble"):
        assert part not in result.text
