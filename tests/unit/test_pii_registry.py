"""The scrubber's recognizers live in a Presidio registry: users add theirs in YAML, and
Presidio's own engines (``AnalyzerEngine``, ``BatchAnalyzerEngine``) run them."""

from __future__ import annotations

from pathlib import Path

import pytest
from presidio_analyzer import BatchAnalyzerEngine
from pydantic import ValidationError

from feedback.pii import build_scrubber
from feedback.pii.checksums import cn_resident_id_valid, iban_valid
from feedback.pii.recognizers_en import PhoneNumberRecognizer
from feedback.pii.scrubber import analyzer_engine, build_registry
from flywheel.settings.scrubber import (
    RECOGNIZERS_YAML_ENV,
    ScrubberSettings,
    load_scrubber_settings,
)

EMPLOYEE_IDS = """\
recognizers:
  - name: EmployeeIdRecognizer
    supported_language: en
    supported_entity: EMPLOYEE_ID
    patterns:
      - name: employee id
        regex: "EMP-\\\\d{6}"
        score: 0.9
"""


@pytest.fixture
def employee_yaml(tmp_path: Path) -> Path:
    path = tmp_path / "recognizers.yaml"
    path.write_text(EMPLOYEE_IDS)
    return path


def test_a_recognizer_added_in_yaml_is_honoured_by_the_scrubber(employee_yaml: Path) -> None:
    settings = ScrubberSettings(
        languages=("en",), entities=("EMAIL_ADDRESS",), recognizers_yaml=employee_yaml
    )
    scrubber = build_scrubber(settings)
    result = scrubber.scrub_text("Badge EMP-004217 belongs to ann@example.com, not EMP-12.")
    assert result.text == "Badge <EMPLOYEE_ID_1> belongs to <EMAIL_ADDRESS_1>, not EMP-12."
    assert result.summary == {"EMPLOYEE_ID": 1, "EMAIL_ADDRESS": 1}


def test_the_yaml_file_is_named_by_the_environment(employee_yaml: Path, tmp_path: Path) -> None:
    assert load_scrubber_settings({}).recognizers_yaml is None
    named = load_scrubber_settings({RECOGNIZERS_YAML_ENV: str(employee_yaml)})
    assert named.recognizers_yaml == employee_yaml
    with pytest.raises(ValidationError, match="does not exist"):
        load_scrubber_settings({RECOGNIZERS_YAML_ENV: str(tmp_path / "missing.yaml")})


def test_batch_analyzer_engine_runs_the_registry(employee_yaml: Path) -> None:
    settings = ScrubberSettings(languages=("en",), recognizers_yaml=employee_yaml)
    registry = build_registry(settings)
    names = {recognizer.name for recognizer in registry.recognizers}
    assert {"IbanCodeRecognizer", "PhoneNumberRecognizer", "EmployeeIdRecognizer"} <= names
    batch = BatchAnalyzerEngine(analyzer_engine=analyzer_engine(registry))
    texts = [
        "Wire it to GB82 WEST 1234 5698 7654 32 today.",
        "My badge is EMP-004217.",
        "Call me on +44 20 7946 0958.",
        "Nothing personal here.",
    ]
    found = [
        sorted(r.entity_type for r in results)
        for results in batch.analyze_iterator(texts, language="en")
    ]
    # Presidio's engine does not fuse overlaps (the scrubber does): the IBAN's digit
    # groups also look like a phone number to it.
    assert "IBAN_CODE" in found[0]
    assert found[1:] == [["EMPLOYEE_ID"], ["PHONE_NUMBER"], []]


def test_validation_flags_valid_identifiers_only() -> None:
    assert iban_valid("GB82 WEST 1234 5698 7654 32")
    assert not iban_valid("GB82 WEST 1234 5698 7654 33")  # mod-97 fails
    assert not iban_valid("GB29 NWBK 6016 1331 9268 19 00")  # too long for the UK
    assert cn_resident_id_valid("11010519491231002X")
    assert not cn_resident_id_valid("110105194912310021")  # check character
    assert not cn_resident_id_valid("110105194913310028")  # month 13
    phones = PhoneNumberRecognizer()
    found = [r.entity_type for r in phones.analyze("call +44 20 7946 0958 now")]
    assert found == ["PHONE_NUMBER"]
    # No country has code 999, and +1 numbers have ten digits.
    assert phones.analyze("call +999 1234567 now") == []
    assert phones.analyze("call +1 234 567 8901 234 now") == []
