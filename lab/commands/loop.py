"""``flywheel loop``: several nights of the whole loop, measured on simulated users.

Real vLLM on the CPU, the gateway, the nightly and canary Prefect flows, on the
embedded defaults; users from ``--users SPEC`` react to the answers they got.
Prints a table per night, writes a plot of satisfaction per night and arm and
the JSON summary, and logs all three to MLflow.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.table import Table
from rich.text import Text

from cli.commands.common import clients, err, out
from flywheel.errors import UsageError
from flywheel.library_logs import library_logs_to_file
from flywheel.settings import Settings, load_settings
from flywheel.wording import in_words

if TYPE_CHECKING:
    from feedback.pii import Scrubber
    from lab.simulation.traffic import Sampling

DEFAULT_USERS = "lab.simulation.users:BuiltinUsers"
FEEDBACK_HELP = (
    "How often the users voice what they think: realistic (the default: thumbs on a few "
    "percent of answers, edits on under 1%), dense (chatty users), no_edits, or a .yaml/.json "
    "file of rates (lab.simulation.feedback_profiles)."
)


def loop(
    line: Annotated[str, typer.Option("--line", help="The business line to run.")],
    users: Annotated[
        str,
        typer.Option(help="User model: path/to/file.py:NAME or package.module:NAME."),
    ] = DEFAULT_USERS,
    feedback: Annotated[str | None, typer.Option(help=FEEDBACK_HELP)] = None,
    nights: Annotated[int, typer.Option(min=1, max=100)] = 3,
    requests: Annotated[int, typer.Option(min=1, help="User requests per night.")] = 200,
    eval_prompts: Annotated[
        int, typer.Option(min=1, help="Fresh prompts scored after the last night.")
    ] = 100,
    seed: Annotated[int, typer.Option(help="Same seed, same users and prompts.")] = 0,
    canary_traffic: Annotated[
        str,
        typer.Option(
            help="share (the default): the canary sees only its true share of each day's "
            "users; picked: users picked per arm so a 5% canary meets --canary-users of them "
            "a round (a shortcut that shows the canary far more users than its share).",
        ),
    ] = "share",
    canary_users: Annotated[
        int, typer.Option(min=1, help="With --canary-traffic picked: users per arm per round.")
    ] = 30,
    first_day: Annotated[
        bool,
        typer.Option(
            "--first-day/--no-first-day",
            help="With --canary-traffic share: a first day of users before the first night; "
            "--no-first-day when FLYWHEEL_HOME's store already holds the line's traffic.",
        ),
    ] = True,
    concurrency: Annotated[
        int,
        typer.Option(
            min=1,
            max=256,
            help="Requests in flight at once (vLLM batches them: on 2 CPU cores 64 answered "
            "1.9x the answers/s of 16, a loop day of 400 users took 5.1 min against 7.1).",
        ),
    ] = 64,
    bad_canary: Annotated[
        bool,
        typer.Option(
            "--bad-canary",
            help="The last night's canary is trained on inverted preferences: see a rollback.",
        ),
    ] = False,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="Write the summary here.")
    ] = None,
    reviewers: Annotated[
        int | None,
        typer.Option(
            min=0,
            max=20,
            help="Simulated reviewers on the feedback page's review queue (the users' "
            "satisfied() with noise, blind to the arm); default: 2 when the line's recipe has "
            "a review block, else none.",
        ),
    ] = None,
    reviews_per_round: Annotated[
        int, typer.Option(min=1, max=10_000, help="Reviews after each canary round.")
    ] = 40,
    review_noise: Annotated[
        float, typer.Option(min=0.0, max=0.5, help="Share of verdicts a reviewer gets wrong.")
    ] = 0.1,
    review_corrections: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="Share of the answers a reviewer fails that it also corrects (the users' own "
            "rewrite; the page stores a correction as an edit). Default 0: verdicts only.",
        ),
    ] = 0.0,
    max_tokens: Annotated[
        int | None,
        typer.Option(
            help="Longest answer the users ask for, in tokens, in the traffic and the final "
            "scoring (default: lab.simulation.traffic.Sampling's).",
        ),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(
            help="Sampling temperature of the users' requests and of the final scoring "
            "(default: lab.simulation.traffic.Sampling's).",
        ),
    ] = None,
) -> None:
    """Run N nights of the loop with simulated users who react to the real answers, then score
    the base model and the final champion on fresh prompts."""
    from lab.simulation.protocol import load_users

    settings = loop_settings(load_settings())
    if line not in settings.business_lines:
        raise UsageError(
            f"unknown business line {line!r}; known: {', '.join(settings.business_lines)}"
        )
    if canary_traffic not in ("share", "picked"):
        raise UsageError(f"--canary-traffic must be share or picked, not {canary_traffic!r}")
    reviewers = reviewers_for(settings, line, reviewers)
    sampling = _sampling(max_tokens=max_tokens, temperature=temperature)
    loaded = load_users(users, feedback)
    if review_corrections and not reviewers:
        raise UsageError("--review-corrections needs simulated reviewers (--reviewers)")
    if review_corrections and not loaded.corrects:
        raise UsageError(
            f"--review-corrections: the user model {users} cannot rewrite an answer "
            "(it has no correct(business_line, prompt, answer) method)"
        )
    loaded.check(line)
    result = run_loop_command(
        settings,
        line,
        loaded,
        nights=nights,
        requests=requests,
        eval_prompts=eval_prompts,
        seed=seed,
        canary_users=canary_users,
        canary_traffic=canary_traffic,
        first_day=first_day,
        concurrency=concurrency,
        bad_canary=bad_canary,
        reviewers=reviewers,
        reviews_per_round=reviews_per_round,
        review_noise=review_noise,
        review_corrections=review_corrections,
        sampling=sampling,
    )
    document = scrub_examples(result.as_dict(), clients(settings).scrubber)
    plot_path = settings.home / "loop" / f"{line}-seed{seed}.png"
    plot_loop(document, plot_path)
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    run_id = log_loop(settings, document, plot_path)
    _print_final(document)
    out.print(
        f"plot: {plot_path}; MLflow run {run_id}" + (f"; JSON: {json_path}" if json_path else "")
    )


def _sampling(**chosen: float | None) -> Sampling:
    """The traffic's sampling with the options given on the command line; a value out of its
    range is a usage error naming the option."""
    from pydantic import ValidationError

    from lab.simulation.traffic import Sampling

    try:
        return Sampling.model_validate({k: v for k, v in chosen.items() if v is not None})
    except ValidationError as exc:
        problems = "; ".join(
            f"--{str(error['loc'][0]).replace('_', '-')}: {error['msg']}" for error in exc.errors()
        )
        raise UsageError(problems) from None


def reviewers_for(settings: Settings, line: str, asked: int | None) -> int:
    """Simulated reviewers: as asked (a review block in the recipe needed), else 2 when the
    line's recipe has a review block (its canary's satisfaction rests on their sample)."""
    from composition.recipes import load_recipe

    assert settings.recipes_dir is not None
    has_review = load_recipe(line, settings.recipes_dir).review is not None
    if asked and not has_review:
        raise UsageError(
            f"--reviewers needs a review block in {line}'s recipe "
            f"({settings.recipes_dir / (line + '.yaml')}): share, rubric, min_reviews"
        )
    if asked is None:
        return 2 if has_review else 0
    return asked


def loop_settings(settings: Settings) -> Settings:
    if settings.recipes_dir is None:
        from composition.recipes import packaged_recipes_dir

        return settings.model_copy(update={"recipes_dir": packaged_recipes_dir() / "demo"})
    return settings


def run_loop_command(
    settings: Settings,
    line: str,
    users: Any,
    *,
    nights: int,
    requests: int,
    eval_prompts: int,
    seed: int,
    canary_users: int,
    bad_canary: bool,
    canary_traffic: str = "share",
    first_day: bool = True,
    concurrency: int = 64,
    reviewers: int = 0,
    reviews_per_round: int = 40,
    review_noise: float = 0.1,
    review_corrections: float = 0.0,
    sampling: Sampling | None = None,
) -> Any:
    """The loop on live services, with progress and a table per night; ``sampling`` (default
    :class:`~lab.simulation.traffic.Sampling`'s) is how the users' requests and the final scoring
    ask the model to answer."""
    from lab.simulation.live import live_services
    from lab.simulation.loop import LoopPlan, run_loop
    from lab.simulation.traffic import Sampling

    plan = LoopPlan(
        business_line=line,
        nights=nights,
        requests=requests,
        eval_prompts=eval_prompts,
        seed=seed,
        canary_users=canary_users,
        champion_users=canary_users,
        canary_traffic="picked" if canary_traffic == "picked" else "share",
        first_day=first_day,
        concurrency=concurrency,
        reviews_per_round=reviews_per_round if reviewers else 0,
        review_noise=review_noise,
        review_corrections=review_corrections,
        sampling=sampling or Sampling(),
    )
    if plan.canary_traffic == "share":
        days = (
            f"{'a first day and ' if first_day else ''}{nights} nights, each followed by a day "
            f"of {requests} requests; "
            f"the canary sees its true share of each day, the canary flow looking "
            f"{plan.canary_rounds} times a day"
        )
    else:
        days = (
            f"{nights} nights x {requests} requests; canary traffic: {canary_users} users per "
            f"arm per round until the canary flow decides (at most {plan.canary_rounds} "
            "rounds), picked with the gateway's own sticky split"
        )
    reviewing = f", {reviewers} simulated reviewers" if reviewers else ", no reviewers"
    if reviewers and review_corrections:
        reviewing += f" correcting {review_corrections:.0%} of the answers they fail"
    out.print(
        Text.assemble(
            ("flywheel loop", "bold"),
            f": {line}, {days}; users {users.spec} "
            f"({users.describe_feedback()}){reviewing}; answers of at most "
            f"{plan.sampling.max_tokens} tokens at temperature {plan.sampling.temperature:g}",
        )
    )
    nights_done: list[int] = []

    def is_bad_night() -> bool:
        # The nightly about to run is the last one (nights are recorded after their nightly).
        return bad_canary and max(nights_done, default=0) == nights - 1

    def on_night(record: Any) -> None:
        nights_done.append(record.night)
        _print_night(record)

    with library_logs_to_file(settings.home, "loop") as log_path:
        out.print(f"trainer and library logs: {log_path}")
        with (
            live_services(
                settings,
                clients(settings),
                report=out.print,
                bad_canary=is_bad_night,
                reviewers=reviewers,
            ) as services,
            _progress() as progress,
        ):
            return run_loop(plan, users, services, progress=progress, on_night=on_night)


@contextmanager
def _progress() -> Iterator[Callable[[str, int], Callable[[int], None]]]:
    """The loop's progress: a bar per stage on a terminal (training's shows its steps and
    latest loss), else a line as each stage starts and as each quarter of it is done."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flywheel.progress import (
        announce_training,
        milestones,
        training_bars,
        training_steps,
    )

    console = Console(stderr=True, markup=False)
    if not console.is_terminal:

        def announce(label: str, total: int) -> Callable[[int], None]:
            return milestones(label, total, err.print)

        with training_steps(announce_training(err.print)):
            yield announce
        return
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn())
    with Progress(*columns, TimeElapsedColumn(), console=console) as bars:

        def bar(label: str, total: int) -> Callable[[int], None]:
            task = bars.add_task(label, total=total)
            return lambda n: bars.advance(task, n)

        with training_steps(training_bars(bars)):
            yield bar


def _print_night(record: Any) -> None:
    table = Table(title=f"night {record.night} ({record.minutes:.1f} min)")
    for column in ("arm", "served", "satisfied"):
        table.add_column(column, justify="right" if column != "arm" else "left")
    for arm, count in sorted(record.served.items()):
        table.add_row(arm, str(count), f"{record.satisfied.get(arm, 0):.3f}")
    out.print(table)
    out.print(f"  nightly: {record.nightly['status']}: {record.nightly['reason']}")
    for decision in record.canary_decisions:
        out.print(f"  canary flow: {decision['action']}: {decision['reason']}")
    out.print(
        f"  champion now {record.champion or 'base model'}; decision: {record.decision}; "
        f"reactions: {in_words(record.reactions)}"
        + (f"; reviews: {in_words(record.reviews)}" if record.reviews else "")
    )
    if record.failures:
        out.print(f"  not taken by the gateway: {in_words(record.failures)}")


def _interval(final: dict[str, Any]) -> str:
    found = final.get("gain_interval")
    return f", 95% {found[0]:+.3f} to {found[1]:+.3f}" if found else ""


def _print_final(document: dict[str, Any]) -> None:
    final = document["final"]
    out.print(
        Text.assemble(
            ("fresh prompts", "bold"),
            f" (n={final['base']['n']}): base satisfied "
            f"{final['base']['satisfied']:.3f}, final champion "
            f"{final['champion']['name'] or 'base'} {final['champion']['satisfied']:.3f} "
            f"(gain {final['gain']:+.3f}{_interval(final)}) in {document['minutes']:.1f} min",
        )
    )
    for example in final["champion"]["examples"][:2]:
        out.print(f"  Q: {example['prompt']}\n  A: {example['answer']!r} -> {example['satisfied']}")


def scrub_examples(document: dict[str, Any], scrubber: Scrubber) -> dict[str, Any]:
    """The summary with PII scrubbed from its example prompts and answers (it reaches MLflow)."""
    for arm in ("base", "champion"):
        for example in document["final"][arm].get("examples", []):
            for field in ("prompt", "answer"):
                example[field] = scrubber.scrub_text(example[field]).text
    return document


def plot_loop(document: dict[str, Any], path: Path) -> Path:
    """Satisfaction per night per arm, and the final base vs champion bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure, (left, right) = plt.subplots(1, 2, figsize=(9, 3.6), width_ratios=(3, 1))
    nights = document["nights"]
    arms = sorted({arm for n in nights for arm in n["satisfied"]})
    for arm in arms:
        points = [(n["night"], n["satisfied"][arm]) for n in nights if arm in n["satisfied"]]
        left.plot(*zip(*points, strict=True), marker="o", label=arm)
    for night in nights:
        left.annotate(
            night["decision"],
            (night["night"], 0.97),
            ha="center",
            va="top",
            fontsize=7,
            color="dimgray",
        )
    left.set_xlabel("night")
    left.set_ylabel("satisfied share of answers")
    left.set_ylim(0, 1)
    left.set_xticks([n["night"] for n in nights])
    left.legend()
    left.set_title(f"{document['line']}: users' satisfaction per night")
    final = document["final"]
    right.bar(["base", "champion"], [final["base"]["satisfied"], final["champion"]["satisfied"]])
    right.set_ylim(0, 1)
    right.set_title(f"fresh prompts (n={final['base']['n']})")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def log_loop(settings: Settings, document: dict[str, Any], plot: Path) -> str:
    """The loop's summary as an MLflow run (experiment ``flywheel-loop``): per-night rates
    as metric steps, the final rates, the JSON and the plot."""
    import tempfile

    from registry.tracking import artifact_root_for

    client = clients(settings).registry.client
    experiment = client.get_experiment_by_name("flywheel-loop")
    if experiment is not None:
        experiment_id = experiment.experiment_id
    else:
        # Like the registry's experiments: artifacts under FLYWHEEL_HOME, never ./mlruns.
        location = None
        if not settings.mlflow_tracking_uri:
            location = (artifact_root_for(settings.home).resolve() / "flywheel-loop").as_uri()
        experiment_id = client.create_experiment("flywheel-loop", artifact_location=location)
    run = client.create_run(
        experiment_id,
        tags={"flywheel.kind": "loop", "flywheel.business_line": document["line"]},
        run_name=f"loop-{document['line']}",
    )
    run_id = run.info.run_id
    client.log_param(run_id, "users", document["users"])
    client.log_param(run_id, "nights", len(document["nights"]))
    for night in document["nights"]:
        for arm, rate in night["satisfied"].items():
            client.log_metric(run_id, f"satisfied.{arm}", rate, step=night["night"])
    for arm in ("base", "champion"):
        client.log_metric(run_id, f"final.{arm}.satisfied", document["final"][arm]["satisfied"])
    client.log_metric(run_id, "final.gain", document["final"]["gain"])
    if interval := document["final"].get("gain_interval"):
        client.log_metric(run_id, "final.gain_low", interval[0])
        client.log_metric(run_id, "final.gain_high", interval[1])
    with tempfile.TemporaryDirectory() as folder:
        summary = Path(folder) / "loop.json"
        summary.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
        client.log_artifact(run_id, str(summary))
    client.log_artifact(run_id, str(plot))
    client.set_terminated(run_id, "FINISHED")
    return run_id
