"""``flywheel demo``: the main job on embedded defaults, end to end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.text import Text

from cli.commands.common import clients, open_store, out, safe_url
from cli.commands.reports import (
    build_datasets,
    parse_start,
    print_buckets,
    print_feedback_page_hint,
    print_funnel,
    print_ingest_report,
    require_file,
)
from flywheel.errors import UsageError
from flywheel.settings import load_settings
from lab.commands.loop import (
    DEFAULT_USERS,
    log_loop,
    loop_settings,
    plot_loop,
    reviewers_for,
    run_loop_command,
    scrub_examples,
)


def demo(
    requests: Annotated[
        int, typer.Option(min=1, help="Yesterday's stored interactions on the other lines.")
    ] = 2_000,
    seed: Annotated[int, typer.Option(help="Simulation seed.")] = 0,
    oasst: Annotated[
        Path | None, typer.Option(help="Also import these OpenAssistant trees (JSONL).")
    ] = None,
    train_line_name: Annotated[
        str, typer.Option("--train-line", help="The line the loop runs on, with its demo recipe.")
    ] = "customer_service",
    nights: Annotated[int, typer.Option(min=1, max=10, help="Nights of the loop.")] = 1,
    loop_requests: Annotated[
        int, typer.Option("--loop-requests", min=1, help="User requests per night.")
    ] = 200,
    users: Annotated[
        str, typer.Option(help="User model: path/to/file.py:NAME or package.module:NAME.")
    ] = DEFAULT_USERS,
    feedback: Annotated[
        str,
        typer.Option(
            help="How often the users voice what they think (see flywheel loop --help). The "
            "demo's one night uses dense users, whose signals suffice to train on 200 requests; "
            "at the realistic rates a night of 200 requests has too few to train on."
        ),
    ] = "dense",
    no_serve: Annotated[
        bool,
        typer.Option("--no-serve", help="Stop after the cleaning funnel: no vLLM, no loop."),
    ] = False,
    bad_canary: Annotated[
        bool,
        typer.Option(
            "--bad-canary",
            help="The night's canary is trained on inverted preferences: see the users' "
            "reactions roll it back.",
        ),
    ] = False,
) -> None:
    """The main job on embedded defaults, end to end: feedback in the store and the cleaning
    funnel, then a short loop on vLLM and the gateway (users react to the real answers, the
    nightly flow puts a candidate on a 5% canary, the canary flow decides from their
    reactions) and the final champion against the base model on fresh prompts."""
    from flywheel.progress import progress_bar
    from lab.simulation.protocol import load_users
    from lab.simulation.stored_traffic import SimulationSettings, TrafficSimulator

    settings = loop_settings(load_settings())
    if train_line_name not in settings.business_lines:
        raise UsageError(f"unknown business line {train_line_name!r}")
    loaded = load_users(users, feedback)
    loaded.check(train_line_name)
    store = open_store(settings)
    out.print(Text.assemble(("1/3", "bold"), f" feedback store: {safe_url(settings)}"))
    if oasst is not None:
        from feedback.importers.business_rules import load_business_rules
        from feedback.importers.oasst import oasst_items
        from feedback.jsonl import iter_jsonl

        require_file(oasst)
        with progress_bar(f"importing {oasst.name}") as advance:
            report = store.ingest(
                oasst_items(iter_jsonl(oasst), load_business_rules()),
                source=str(oasst),
                on_progress=advance,
            )
        print_ingest_report(report)
    others = tuple(line for line in settings.business_lines if line != train_line_name)
    if others:
        simulation = SimulationSettings(
            requests=requests, seed=seed, start=parse_start(None), business_lines=others
        )
        out.print(f"yesterday's stored traffic on {', '.join(others)}: {requests} requests")
        with progress_bar("simulating") as advance:
            report = store.ingest(
                TrafficSimulator(simulation).events(),
                source=f"simulate:seed={seed}",
                on_progress=advance,
            )
        print_ingest_report(report)
        print_buckets(store.stats())
        out.print(
            Text.assemble(
                ("2/3", "bold"), f" cleaning {', '.join(others)}: PII scrubbing, dedup, datasets"
            )
        )
        for result in build_datasets(settings, store, list(others)):
            print_funnel(result.business_line, result.funnel.as_dict())
    if no_serve:
        out.print("stopping before serving (--no-serve)")
        return
    out.print(
        Text.assemble(
            ("3/3", "bold"),
            f" the loop on {train_line_name}: {nights} night(s) of {loop_requests} users "
            "through the gateway, nightly flow, canary, canary flow"
            + (
                " (the canary is trained on inverted preferences: --bad-canary)"
                if bad_canary
                else ""
            ),
        )
    )
    result = run_loop_command(
        settings,
        train_line_name,
        loaded,
        nights=nights,
        requests=loop_requests,
        eval_prompts=50,
        seed=seed,
        canary_users=30,
        bad_canary=bad_canary,
        # The canary's satisfaction rests on the reviewers' blind sample: without them it
        # waits on "fewer than 30 reviews" and the demo never promotes.
        reviewers=reviewers_for(settings, train_line_name, None),
        # Minutes, not days: the demo picks 30 users per arm a round (flywheel loop shows the
        # canary only its true share).
        canary_traffic="picked",
    )
    document = scrub_examples(result.as_dict(), clients(settings).scrubber)
    plot = plot_loop(document, settings.home / "loop" / f"demo-{train_line_name}.png")
    run_id = log_loop(settings, document, plot)
    final = document["final"]
    out.print(
        f"fresh prompts (n={final['base']['n']}): base satisfied {final['base']['satisfied']:.2f}, "
        f"champion {final['champion']['name'] or 'base'} {final['champion']['satisfied']:.2f}"
    )
    from registry.tracking import tracking_uri_for

    tracking = tracking_uri_for(settings.home, settings.mlflow_tracking_uri)
    out.print("\nwhere to look:")
    out.print(f"  the loop: plot {plot}; MLflow run {run_id} (experiment flywheel-loop)")
    out.print(f"  store: {safe_url(settings)} (flywheel buckets, flywheel routes)")
    out.print(f"  canary decisions: flywheel canary status {train_line_name}")
    out.print(f"  datasets: {settings.datasets_dir}")
    out.print(f"  MLflow: .venv/bin/mlflow ui --backend-store-uri {tracking} (flywheel runs)")
    from flows.schedule import prefect_server_command

    out.print(
        f"  Prefect: {prefect_server_command(settings.home / 'prefect')}, then "
        "http://127.0.0.1:4200 (each flow run's logs and artifacts)"
    )
    print_feedback_page_hint(settings)
