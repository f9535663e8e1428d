"""The feedback page's pure parts: filters, cursors, binning, rates, diffs, plots, funnel."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dashboard.access import Viewer, check_line, is_loopback
from dashboard.diffs import edit_diff, similarity, tokens
from dashboard.errors import PageError
from dashboard.evals import metric_rows, metric_spreads, samples_of_table
from dashboard.filters import BucketFilter, Cursor, parse_cursor, parse_filter
from dashboard.lineage import drop_reasons, funnel_signals, funnel_steps
from dashboard.plots import funnel_chart, line_chart, metric_bars
from dashboard.shaping import (
    adapter_totals,
    bucket_size,
    bucket_start,
    compare_arms,
    default_range,
    time_series,
)
from feedback.rollup import RollupCount, ceil_hour, feedback_signal, floor_hour, merge_counts
from gateway.keys import ApiKey

T0 = datetime(2026, 11, 1, tzinfo=UTC)


def cell(adapter: str, hours: int, signal: str, count: int, line: str = "legal") -> RollupCount:
    return RollupCount(line, adapter, T0 + timedelta(hours=hours), signal, count)


# --- filters ------------------------------------------------------------------------------------


def test_filter_parses_dates_and_makes_until_inclusive_of_its_day() -> None:
    bucket = parse_filter("2026-11-01", "2026-11-02", "edit", "legal-v2")
    assert bucket.since == T0
    assert bucket.until == T0 + timedelta(days=2)
    assert bucket.signal == "edit"
    assert bucket.adapter == "legal-v2"
    assert parse_filter(**bucket.params()) == bucket  # round trip through the query string


def test_filter_takes_times_and_blank_values() -> None:
    bucket = parse_filter("2026-11-01T13:30", "", " ", None)
    assert bucket == BucketFilter(since=T0.replace(hour=13, minute=30))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"since": "yesterday"}, "bad 'since'"),
        ({"until": "2026-13-01"}, "bad 'until'"),
        ({"since": "2026-11-02", "until": "2026-11-01"}, "bad time range"),
        ({"signal": "smile"}, "bad 'signal'"),
        ({"adapter": "../etc"}, "bad 'adapter'"),
    ],
)
def test_bad_filters_are_400_with_a_reason(args: dict[str, str], message: str) -> None:
    with pytest.raises(PageError) as refused:
        parse_filter(**args)
    assert refused.value.status == 400
    assert message in refused.value.message


def test_query_string_keeps_filters_and_adds_the_cursor() -> None:
    bucket = BucketFilter(since=T0, signal="thumbs_down")
    assert bucket.query(cursor="abc") == "?since=2026-11-01&signal=thumbs_down&cursor=abc"
    assert bucket.without("signal").query() == "?since=2026-11-01"
    assert BucketFilter().query() == ""


@given(
    st.datetimes(min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1)),
    st.integers(min_value=1, max_value=2**62),
)
def test_cursor_round_trips(when: datetime, ident: int) -> None:
    cursor = Cursor(when.replace(tzinfo=UTC), ident)
    assert parse_cursor(cursor.encode()) == cursor


@pytest.mark.parametrize("token", ["x", "bm90IGEgY3Vyc29y", "MjAyNi0xMS0wMXw1"])
def test_tampered_cursor_is_400(token: str) -> None:
    with pytest.raises(PageError) as refused:
        parse_cursor(token)
    assert refused.value.status == 400


# --- rollup shaping -----------------------------------------------------------------------------


def test_hours_floor_and_ceil() -> None:
    at = T0 + timedelta(hours=3, minutes=5)
    assert floor_hour(at) == T0 + timedelta(hours=3)
    assert ceil_hour(at) == T0 + timedelta(hours=4)
    assert ceil_hour(T0) == T0


def test_task_outcomes_split_by_result() -> None:
    assert feedback_signal("task_outcome", "success") == "task_success"
    assert feedback_signal("task_outcome", "failure") == "task_failure"
    assert feedback_signal("edit", None) == "edit"


def test_merge_adds_equal_cells_and_drops_zeros() -> None:
    merged = merge_counts(
        [cell("a", 0, "edit", 2)], [cell("a", 0, "edit", 3), cell("a", 1, "x", 0)]
    )
    assert merged == [cell("a", 0, "edit", 5)]


def test_totals_per_adapter_with_rates_and_an_all_row() -> None:
    cells = [
        cell("legal-v1", 0, "requests", 100),
        cell("legal-v1", 0, "thumbs_down", 10),
        cell("legal-v2", 1, "requests", 50),
        cell("legal-v2", 1, "thumbs_down", 1),
    ]
    rows = adapter_totals(cells, ["legal-v2", "legal-v1"])
    assert [r.adapter for r in rows] == ["legal-v2", "legal-v1", "all"]
    assert rows[1].rate("thumbs_down") == pytest.approx(0.1)
    assert rows[2].requests == 150
    assert rows[2].count("thumbs_down") == 11
    assert adapter_totals([])[0:] == []
    assert rows[0].rate("edit") == 0.0


def test_bucket_size_bounds_the_points() -> None:
    assert bucket_size(T0, T0 + timedelta(days=2), 120) == timedelta(hours=1)
    assert bucket_size(T0, T0 + timedelta(days=30), 120) == timedelta(hours=6)
    assert bucket_size(T0, T0 + timedelta(days=31), 120) == timedelta(hours=12)
    assert bucket_size(T0, T0 + timedelta(days=3650), 120) == timedelta(days=28)
    week = bucket_start(T0 + timedelta(days=3), timedelta(days=7))
    assert week.weekday() == 0  # weeks start on Monday


def test_series_bins_cells_and_leaves_unknown_rates_empty() -> None:
    cells = [
        cell("legal-v1", 0, "requests", 4),
        cell("legal-v1", 0, "edit", 1),
        cell("legal-v1", 2, "requests", 6),
        cell("legal-v1", 99, "requests", 6),  # outside the range: ignored
    ]
    series = time_series(cells, T0, T0 + timedelta(hours=3), 120, ["legal-v1", "legal-v2"])
    assert len(series.starts) == 3
    assert series.counts["legal-v1"]["requests"] == [4, 0, 6]
    assert series.rates("legal-v1", "edit") == [0.25, None, 0.0]
    assert series.rates("legal-v2", "edit") == [None, None, None]


def test_default_range_comes_from_the_data() -> None:
    span = (T0, T0 + timedelta(days=2))
    assert default_range(span, None, None) == span
    assert default_range(span, T0 + timedelta(days=1), None) == (T0 + timedelta(days=1), span[1])
    start, end = default_range(None, None, None)
    assert end - start == timedelta(days=7)


def test_canary_against_champion() -> None:
    cells = [
        cell("legal-v2", 0, "requests", 1000),
        cell("legal-v2", 0, "thumbs_down", 50),
        cell("legal-v3", 0, "requests", 100),
        cell("legal-v3", 0, "thumbs_down", 10),
    ]
    champion, canary, rows = compare_arms(cells, "legal-v2", "legal-v3")
    assert (champion, canary) == (1000, 100)
    down = next(r for r in rows if r.signal == "thumbs_down")
    assert down.difference == pytest.approx(0.05)
    missing = compare_arms([], "legal-v2", "legal-v3")[2][0]
    assert missing.difference is None


# --- diffs --------------------------------------------------------------------------------------


def test_diff_marks_words_and_reads_back_both_texts() -> None:
    segments = edit_diff("Restart the router twice.", "Restart the modem once.")
    assert [s.op for s in segments] == [
        "same",
        "removed",
        "added",
        "same",
        "removed",
        "added",
        "same",
    ]
    assert "".join(s.text for s in segments if s.op != "added") == "Restart the router twice."
    assert "".join(s.text for s in segments if s.op != "removed") == "Restart the modem once."


def test_chinese_is_compared_character_by_character() -> None:
    assert tokens("请重启路由器") == list("请重启路由器")
    segments = edit_diff("请重启路由器", "请重启调制解调器")
    assert segments[0].text == "请重启"
    assert similarity("abc", "abc") == 1.0


@given(st.text(max_size=80), st.text(max_size=80))
def test_diff_always_rebuilds_both_sides(before: str, after: str) -> None:
    segments = edit_diff(before, after)
    assert "".join(s.text for s in segments if s.op != "added") == before
    assert "".join(s.text for s in segments if s.op != "removed") == after


# --- plots --------------------------------------------------------------------------------------


def test_line_chart_escapes_labels_and_gaps_unknown_points() -> None:
    starts = [T0 + timedelta(hours=h) for h in range(4)]
    svg = line_chart("<b>rate</b>", starts, timedelta(hours=1), {"a<x>": [0.1, None, 0.2, 0.3]})
    assert svg.startswith("<svg")
    assert "<b>" not in svg
    assert "&lt;b&gt;rate&lt;/b&gt;" in svg
    assert svg.count("<polyline") == 1  # the lone point before the gap is a dot
    assert svg.count("<circle") == 3  # a short series marks each point, the lone one too
    assert "http" not in svg.replace('xmlns="http://www.w3.org/2000/svg"', "")


def test_empty_charts_still_render() -> None:
    assert "<svg" in line_chart("empty", [], timedelta(hours=1), {})
    assert "<svg" in funnel_chart([])
    assert "n/a" in metric_bars([("accuracy", 0.7, None)])


def test_funnel_chart_shows_shares_of_the_raw_count() -> None:
    svg = funnel_chart([("raw", 200), ("deduplicated", 50)])
    assert "200 (100%)" in svg
    assert "50 (25%)" in svg


# --- funnel and evals ---------------------------------------------------------------------------

FUNNEL = {
    "steps": {
        "pulled": {"edit": 5, "thumbs_up": 10},
        "filtered": {"edit": 4, "thumbs_up": 9},
        "deduplicated": {"edit": 4, "thumbs_up": 6},
        "in_training": {"edit": 4, "thumbs_up": 2},
    },
    "dropped": {"near": 2, "exact": 1, "pii_only": 1, "failed_request": 1, "user_cap:dpo": 3},
    "pii": {"PERSON": 3},
    "examples": {"sft": 4},
}


def test_funnel_steps_and_reasons_in_words() -> None:
    assert funnel_steps(FUNNEL) == [
        ("raw", 15),
        ("scrubbed + filtered", 13),
        ("deduplicated", 10),
        ("in training data", 6),
    ]
    reasons = dict(drop_reasons(FUNNEL))
    assert reasons["duplicate cluster (near)"] == 2
    assert reasons["PII only (nothing left once scrubbed)"] == 1
    assert reasons["per-user cap (dpo examples)"] == 3
    assert funnel_signals(FUNNEL) == ["edit", "thumbs_up"]
    assert funnel_steps({}) == []


def test_metric_rows_pair_candidate_and_champion() -> None:
    rows = metric_rows(
        {"candidate.general_loss": 2.0, "champion.general_loss": 2.1, "candidate.zeta": 1.0}
    )
    assert rows == (("general_loss", 2.0, 2.1), ("zeta", 1.0, None))
    # eval.* names: a share's n and interval bounds are no rows of their own
    logged = {
        "eval.candidate.preference_accuracy": 1.0,
        "eval.champion.preference_accuracy": 0.0,
        "eval.candidate.preference_accuracy_n": 4.0,
        "eval.candidate.preference_accuracy_low": 0.51,
        "eval.candidate.preference_accuracy_high": 1.0,
        "eval.champion.preference_accuracy_low": 0.0,
        "eval.champion.preference_accuracy_high": 0.49,
        "eval.preference_accuracy_difference": 1.0,
        "eval.preference_accuracy_difference_low": 0.4,
        "eval.preference_accuracy_difference_high": 1.0,
        "eval.candidate.general_loss": 2.0,
    }
    assert metric_rows(logged) == (("preference_accuracy", 1.0, 0.0), ("general_loss", 2.0, None))
    ((name, spread),) = metric_spreads(logged)
    assert (name, spread.n, spread.candidate, spread.champion) == (
        "preference_accuracy",
        4,
        (0.51, 1.0),
        (0.0, 0.49),
    )
    assert spread.difference == (1.0, 0.4, 1.0)


def test_samples_table_rows() -> None:
    table = {"columns": ["prompt", "candidate_answer"], "data": [["Hi?", "Hello."]]}
    (sample,) = samples_of_table(table)
    assert (sample.prompt, sample.candidate_answer, sample.champion_answer) == (
        "Hi?",
        "Hello.",
        None,
    )


# --- access -------------------------------------------------------------------------------------


def test_loopback_addresses() -> None:
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert not is_loopback("10.0.0.5")
    assert not is_loopback("testclient")
    assert not is_loopback(None)


def test_a_key_sees_only_its_lines() -> None:
    key = ApiKey(name="support", sha256="0" * 64, business_lines=("legal",))
    viewer = Viewer("support", key)
    assert viewer.lines_among(["medical", "legal"]) == ["legal"]
    check_line(viewer, "legal", ["legal", "medical"])
    with pytest.raises(PageError) as refused:
        check_line(viewer, "medical", ["legal", "medical"])
    assert refused.value.status == 403
    with pytest.raises(PageError) as unknown:
        check_line(viewer, "nowhere", ["legal"])
    assert unknown.value.status == 403  # a limited key learns nothing about other lines
    everyone = Viewer("admin", ApiKey(name="admin", sha256="1" * 64, business_lines=("*",)))
    with pytest.raises(PageError) as missing:
        check_line(everyone, "nowhere", ["legal"])
    assert missing.value.status == 404
