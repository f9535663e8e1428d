"""Property tests: the JSONL reader accounts for every line of any input and never raises."""

from __future__ import annotations

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from feedback.jsonl import JsonlRecord, MalformedLine, dumps_line, iter_jsonl_lines

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
objects = st.dictionaries(st.text(max_size=10), json_values, max_size=6)


@given(st.lists(st.binary(max_size=200), max_size=30))
@settings(max_examples=300)
def test_every_nonblank_line_yields_exactly_one_item(lines: list[bytes]) -> None:
    raw_lines = [line.replace(b"\n", b" ") + b"\n" for line in lines]
    items = list(iter_jsonl_lines(raw_lines))
    expected = [i for i, line in enumerate(raw_lines, start=1) if line.strip()]
    assert [item.line_number for item in items] == expected
    for item in items:
        assert isinstance(item, JsonlRecord | MalformedLine)
        assert item.raw == raw_lines[item.line_number - 1]
        if isinstance(item, MalformedLine):
            assert item.reason
            assert f"x:{item.line_number}: " in item.describe("x")


@given(st.lists(objects, max_size=20))
def test_objects_round_trip(records: list[dict[str, object]]) -> None:
    lines = [dumps_line(record) for record in records]
    items = list(iter_jsonl_lines(lines))
    assert all(isinstance(item, JsonlRecord) for item in items)
    assert [item.data for item in items if isinstance(item, JsonlRecord)] == records


@given(objects, st.binary(min_size=1, max_size=20), st.integers(min_value=0, max_value=50))
def test_corruption_is_reported_not_raised(record: dict[str, object], junk: bytes, at: int) -> None:
    good = dumps_line(record).rstrip(b"\n")
    position = min(at, len(good))
    corrupted = good[:position] + junk + good[position:]
    items = list(iter_jsonl_lines([corrupted]))
    if not corrupted.strip():
        assert items == []
        return
    assert len(items) == 1
    item = items[0]
    if isinstance(item, JsonlRecord):
        assert item.data == orjson.loads(corrupted.strip())
    else:
        assert item.line_number == 1


def test_specific_malformations_have_clear_reasons() -> None:
    lines = [b'{"a": 1}\n', b"[1, 2]\n", b"{broken\n", b'{"a": "\xff"}\n', b"   \n", b'"text"\n']
    items = list(iter_jsonl_lines(lines))
    reasons = {item.line_number: getattr(item, "reason", None) for item in items}
    assert reasons[1] is None
    assert reasons[2] == "expected a JSON object, got list"
    assert reasons[3] is not None
    assert reasons[3].startswith("not valid JSON")
    assert reasons[4] == "invalid UTF-8 at byte 7"
    assert 5 not in reasons
    assert reasons[6] == "expected a JSON object, got str"
