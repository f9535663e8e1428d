"""Each arm's counts of an A/B experiment kept as a running tally, so the feedback page
costs what arrived since its last view, not the experiment's size.

Every metric of ``registry.experiments`` is a rule on which :data:`FLAGS` a request has
(a thumbs-up, a failed task, a cancelled answer), and a request's flags change after it
is served: a task outcome arrives days later, a thumbs-down after a thumbs-up turns a
"satisfied" request into an unsatisfied one. So a count of events cannot be added up;
the tally keeps, per experiment and arm, how many requests have each set of flags (a
bit mask: a few dozen cells), and per experiment its marks: the last interaction id and
the last feedback event id it has counted. A fold reads only the requests those ids
touch: the experiment's requests served above the interaction mark (added with their
flags now), and its older requests with feedback above the feedback mark (moved from
their flags as of the old mark to their flags now: late feedback counts). Every metric
is then a sum over the cells (``registry.experiments.metric_counts``).

Exact and fresh, as the hourly rollup is (``feedback.rollup``'s docstring has the why of
the grace): a fold moves the marks only over rows ingested more than ``grace`` ago, and
each read adds the rows above the marks counted live, so a page shows every request
and every late outcome up to the moment it is drawn. The marks move by compare-and-set
(``version``) in the transaction that writes the cells: of two folds at once, one wins
and the other writes nothing.

A running experiment counts every request its arms served since it started. When it
ends, the requests its tally counted past the end (served in the seconds before the
gateway saw the routes change) are taken out once and the window is closed.

Deletions are not folded: ``FeedbackStore.forget_user`` and retention's ``delete`` drop
the tallies they may touch, and the next view counts those experiments again. Looks, which
decide, never read the tally: ``composition.experiments.look_experiment`` recounts the raw tables
(``registry.experiment_store.current_look``); tests hold the two equal. A look also bounds
what one user and one key count (``feedback.contributions``), which a running tally of
flag sets cannot: where a user sent more than the bound, the page counts every request and
the recorded looks only the user's first ones.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Engine,
    Select,
    and_,
    case,
    delete,
    func,
    literal,
    select,
    true,
    union,
    update,
)
from sqlalchemy.dialects import postgresql, sqlite

from feedback.schema import feedback_table, interactions_table
from registry.experiment_store import ARM_LABELS, ExperimentRecord, flag_conditions
from registry.experiments import FLAGS, METRICS, ArmLabel, ExperimentLook, judge_experiment
from registry.experiments import metric_counts as counts_of
from registry.tables import experiment_tallies_table, experiment_tally_marks_table

FLAG_NAMES = ",".join(FLAGS)
_ARM_OF = {label: arm for arm, label in ARM_LABELS.items()}
Tally = dict[ArmLabel, Counter[int]]


@dataclass(frozen=True, slots=True)
class TallyMarks:
    """What an experiment's tally has counted (all zero before its first fold)."""

    interaction_id: int = 0
    feedback_id: int = 0
    window_until: datetime | None = None
    flag_names: str = FLAG_NAMES
    version: int = 0


@dataclass(frozen=True, slots=True)
class ArmTallies:
    """Each arm's requests by flag mask, counted up to ``counted_at`` (folded cells and the
    live rows above ``marks``)."""

    record: ExperimentRecord
    arms: Tally
    marks: TallyMarks
    counted_at: datetime

    def look(self) -> ExperimentLook:
        """The verdict these counts give (recorded by nobody: a look at the page)."""
        metric = METRICS[self.record.metric]
        a = counts_of(self.arms["a"])[metric.name]
        b = counts_of(self.arms["b"])[metric.name]
        return judge_experiment(metric, a, b, self.record.policy)

    @property
    def requests(self) -> dict[ArmLabel, int]:
        """Every request of each arm so far, whatever the metric counts."""
        return {arm: sum(cells.values()) for arm, cells in self.arms.items()}


def _empty() -> Tally:
    return {"a": Counter(), "b": Counter()}


def _mask(conditions: dict[str, ColumnElement[bool]]) -> ColumnElement[Any]:
    """SQL for one request's flag mask (aggregated over its joined feedback rows)."""
    bits = [
        func.max(case((conditions[flag], 1), else_=0)) * literal(1 << bit)
        for bit, flag in enumerate(FLAGS)
    ]
    return functools.reduce(operator.add, bits)


def changes_query(
    record: ExperimentRecord,
    marks: TallyMarks,
    interaction_upto: int | None = None,
    feedback_upto: int | None = None,
) -> Select[Any]:
    """The requests whose cells change when the tally moves from ``marks`` to the given ids
    (None: every row there is now) and closes its window once the experiment ended, counted
    by arm, whether they were counted and are kept, and their flag masks before and after.

    Only the rows above the marks select requests (primary-key ranges, then a unique-index
    probe per touched request and its feedback), except on a first fold (marks at zero),
    which reads the experiment's window on the line's index.
    """
    i, f = interactions_table.c, feedback_table.c
    end = record.ended_at
    arm = [
        i.business_line == record.business_line,
        i.arm.in_(list(ARM_LABELS.values())),
        i.created_at >= record.started_at,
    ]
    window = [*arm, i.created_at < end] if end is not None else arm
    served = [i.id > marks.interaction_id]
    if interaction_upto is not None:
        served.append(i.id <= interaction_upto)
    touched = [select(i.id).where(*window, *served)]
    if marks.interaction_id > 0:
        arrived = [f.id > marks.feedback_id]
        if feedback_upto is not None:
            arrived.append(f.id <= feedback_upto)
        touched.append(
            select(i.id)
            .select_from(feedback_table.join(interactions_table, i.request_id == f.request_id))
            .where(*arrived, i.id <= marks.interaction_id, *window)
        )
        if end is not None and marks.window_until is None:
            touched.append(
                select(i.id).where(*arm, i.created_at >= end, i.id <= marks.interaction_id)
            )
    ids = union(*touched).subquery() if len(touched) > 1 else touched[0].subquery()
    bound = f.id <= feedback_upto if feedback_upto is not None else true()
    counted = case((i.id <= marks.interaction_id, 1), else_=0)
    kept = case((i.created_at < end, 1), else_=0) if end is not None else literal(1)
    per_request = (
        select(
            i.arm.label("arm"),
            counted.label("counted"),
            kept.label("kept"),
            _mask(flag_conditions(marks.feedback_id)).label("before"),
            _mask(flag_conditions()).label("after"),
        )
        .select_from(
            ids.join(interactions_table, i.id == ids.c.id).outerjoin(
                feedback_table, and_(f.request_id == i.request_id, bound)
            )
        )
        .group_by(i.id, i.arm, i.created_at)
        .subquery()
    )
    keys = [per_request.c[name] for name in ("arm", "counted", "kept", "before", "after")]
    return select(*keys, func.count().label("n")).group_by(*keys)


def _changes(
    connection: Connection,
    record: ExperimentRecord,
    marks: TallyMarks,
    interaction_upto: int | None,
    feedback_upto: int | None,
) -> Tally:
    """How each arm's cells change (:func:`changes_query`)."""
    changes = _empty()
    query = changes_query(record, marks, interaction_upto, feedback_upto)
    for row in connection.execute(query):
        cells = changes[_ARM_OF[row.arm]]
        if row.counted:
            cells[int(row.before)] -= int(row.n)
        if row.kept:
            cells[int(row.after)] += int(row.n)
    return changes


def _marks_of(row: Any) -> TallyMarks:
    if row.flag_names != FLAG_NAMES:
        # Counted with other flags (an older release): what it holds is counted again.
        return TallyMarks(flag_names=row.flag_names, version=int(row.version))
    return TallyMarks(
        int(row.interaction_id),
        int(row.feedback_id),
        row.window_until,
        row.flag_names,
        int(row.version),
    )


def _marks(connection: Connection, experiment_id: int) -> TallyMarks | None:
    marks = experiment_tally_marks_table
    row = connection.execute(select(marks).where(marks.c.experiment_id == experiment_id)).first()
    return _marks_of(row) if row is not None else None


def _snapshot(connection: Connection, experiment_id: int) -> tuple[TallyMarks, Tally]:
    """The marks and the cells they cover, in one statement (one snapshot: a fold that
    commits meanwhile is seen whole or not at all)."""
    marks, cells = experiment_tally_marks_table.c, experiment_tallies_table.c
    rows = connection.execute(
        select(
            marks.interaction_id,
            marks.feedback_id,
            marks.window_until,
            marks.flag_names,
            marks.version,
            cells.arm,
            cells.flag_mask,
            cells.requests,
        )
        .select_from(
            experiment_tally_marks_table.outerjoin(
                experiment_tallies_table, cells.experiment_id == marks.experiment_id
            )
        )
        .where(marks.experiment_id == experiment_id)
    ).all()
    tally = _empty()
    if not rows:
        return TallyMarks(), tally
    found = _marks_of(rows[0])
    if found.flag_names == FLAG_NAMES:
        for row in rows:
            if row.arm is not None:
                tally[row.arm][int(row.flag_mask)] += int(row.requests)
    return found, tally


def _settled(connection: Connection, table: Any, above: int, cutoff: datetime) -> int:
    """The highest id above ``above`` among rows ingested before ``cutoff`` (``above``
    when none): how far a fold may move a mark."""
    found = connection.execute(
        select(func.max(table.c.id)).where(table.c.id > above, table.c.ingested_at < cutoff)
    ).scalar()
    return int(found) if found is not None else above


def _insert(engine: Engine) -> Any:
    return postgresql.insert if engine.dialect.name == "postgresql" else sqlite.insert


def _start(engine: Engine, experiment_id: int, now: datetime) -> None:
    """Give the experiment empty marks, if it has none yet."""
    with engine.begin() as connection:
        connection.execute(
            _insert(engine)(experiment_tally_marks_table)
            .values(
                experiment_id=experiment_id,
                interaction_id=0,
                feedback_id=0,
                window_until=None,
                flag_names=FLAG_NAMES,
                version=0,
                updated_at=now,
            )
            .on_conflict_do_nothing(index_elements=["experiment_id"])
        )


def _write(connection: Connection, engine: Engine, experiment_id: int, changes: Tally) -> None:
    cells = experiment_tallies_table
    rows = [
        {"experiment_id": experiment_id, "arm": arm, "flag_mask": mask, "requests": n}
        for arm, masks in changes.items()
        for mask, n in masks.items()
        if n
    ]
    if not rows:
        return
    statement = _insert(engine)(cells)
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=["experiment_id", "arm", "flag_mask"],
            set_={"requests": cells.c.requests + statement.excluded.requests},
        ),
        rows,
    )
    connection.execute(
        delete(cells).where(cells.c.experiment_id == experiment_id, cells.c.requests == 0)
    )


def fold_tally(
    engine: Engine,
    record: ExperimentRecord,
    *,
    grace: timedelta = timedelta(minutes=2),
    now: datetime | None = None,
) -> bool:
    """Fold the rows ingested more than ``grace`` ago into the experiment's tally (and close
    its window once it ended); True when this call moved it."""
    when = now or datetime.now(UTC)
    with engine.connect() as connection:
        marks = _marks(connection, record.id)
    if marks is None:
        _start(engine, record.id, when)
        marks = TallyMarks()
    stale = marks.flag_names != FLAG_NAMES
    cutoff = when - grace
    with engine.connect() as connection:
        interaction_upto = _settled(connection, interactions_table, marks.interaction_id, cutoff)
        feedback_upto = _settled(connection, feedback_table, marks.feedback_id, cutoff)
    closing = record.ended_at is not None and marks.window_until is None
    if (
        not stale
        and not closing
        and (interaction_upto, feedback_upto) == (marks.interaction_id, marks.feedback_id)
    ):
        return False
    table = experiment_tally_marks_table
    with engine.begin() as connection:
        moved = connection.execute(
            update(table)
            .where(table.c.experiment_id == record.id, table.c.version == marks.version)
            .values(
                interaction_id=interaction_upto,
                feedback_id=feedback_upto,
                window_until=record.ended_at,
                flag_names=FLAG_NAMES,
                version=marks.version + 1,
                updated_at=when,
            )
        ).rowcount
        if moved != 1:
            return False  # another fold moved the marks first and wrote these rows' cells
        if stale:
            cells = experiment_tallies_table
            connection.execute(delete(cells).where(cells.c.experiment_id == record.id))
        changes = _changes(connection, record, marks, interaction_upto, feedback_upto)
        _write(connection, engine, record.id, changes)
    return True


def arm_tallies(
    engine: Engine,
    record: ExperimentRecord,
    *,
    grace: timedelta = timedelta(minutes=2),
    now: datetime | None = None,
) -> ArmTallies:
    """Each arm's requests by flag set now: the tally folded first, then the rows above its
    marks counted live."""
    when = now or datetime.now(UTC)
    fold_tally(engine, record, grace=grace, now=when)
    with engine.connect() as connection:
        marks, tally = _snapshot(connection, record.id)
        tail = _changes(connection, record, marks, None, None)
    for arm, cells in tail.items():
        tally[arm].update(cells)
        tally[arm] = Counter({mask: n for mask, n in tally[arm].items() if n})
    return ArmTallies(record, tally, marks, when)
