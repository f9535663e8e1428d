"""``flywheel canary``, ``flywheel routes``, ``flywheel gateway``, ``flywheel serve gateway``
and ``flywheel serve dashboard``."""

from __future__ import annotations

import getpass
import time
from typing import TYPE_CHECKING, Annotated

import orjson
import typer
from rich.table import Table
from rich.text import Text

from cli.commands.common import clients, open_store, out
from flywheel.errors import UsageError
from flywheel.settings import Settings, load_settings

if TYPE_CHECKING:
    from composition.rollout import Rollout
    from feedback.store import FeedbackStore
    from registry.lifecycle import ByHand, Transition
    from registry.routes import RouteStore
    from registry.routing import RoutingTable
    from registry.shadow import ShadowDecision, ShadowReport

canary_app = typer.Typer(
    help="Send a share of a line's users to a new adapter.", no_args_is_help=True
)
routes_app = typer.Typer(help="Where each business line's traffic goes.")
shadow_app = typer.Typer(
    help="Mirror a share of a line's champion requests to an adapter users never see.",
    no_args_is_help=True,
)
canary_app.add_typer(shadow_app, name="shadow")
gateway_app = typer.Typer(help="The gateway's API keys.", no_args_is_help=True)
lifecycle_app = typer.Typer(
    help="Whether routing, MLflow aliases and the loaded adapters agree.", no_args_is_help=True
)


def _actor() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


def _check_line(settings: Settings, line: str) -> None:
    if line not in settings.business_lines:
        known = ", ".join(settings.business_lines)
        raise UsageError(f"unknown business line {line!r} (configured: {known})")


def _rollout(business_line: str) -> Rollout:
    """The line's rollout door (``registry.rollout``), the operator as its actor: every
    routing change a command makes goes through it."""
    from composition.rollout import rollout
    from registry.vllm_admin import vllm_in_flight

    settings = load_settings()
    _check_line(settings, business_line)
    upstreams = settings.gateway.upstreams
    return rollout(
        settings,
        clients(settings),
        business_line,
        upstreams,
        in_flight=vllm_in_flight(upstreams),
        actor=_actor(),
    )


def _by_hand(business_line: str, event: ByHand, *, check: bool = True) -> Transition:
    """The operator's ``event`` through the line's door (a replica that is down is vLLM's
    own error and exit code; a refusal names why, exit 2)."""
    return _rollout(business_line).by_hand(event, check=check)


@canary_app.command("set")
def canary_set(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    adapter: Annotated[str, typer.Argument(help="The canary adapter, <line>-v<version>.")],
    fraction: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of the line's users (sticky).")
    ] = 0.05,
    reason: Annotated[str | None, typer.Option(help="Why, for the routing history.")] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="Load and probe it where the line is placed first; --no-check changes the "
            "routing alone (vLLM and MLflow untouched).",
        ),
    ] = True,
) -> None:
    """Send a sticky share of the line's users to ``adapter`` (every gateway within a second):
    loaded from the registry and probed on every replica the line is placed on, then routed,
    with MLflow's ``canary`` alias; a canary it replaces is rolled back."""
    from registry.lifecycle import CanaryStartedByHand

    started = CanaryStartedByHand(adapter, fraction, reason or "canary set by hand")
    table = _by_hand(business_line, started, check=check).table
    out.print(
        f"{business_line}: {table.canary} on {table.canary_fraction:.1%} of users, "
        f"champion {table.champion or 'base model'}"
    )


@canary_app.command("clear")
def canary_clear(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    reason: Annotated[
        str | None, typer.Option(help="Why, for the routing history and MLflow.")
    ] = None,
) -> None:
    """Every user of the line back on the champion (every gateway within a second); the canary
    is rolled back: its version rejected in MLflow with the reason, drained and unloaded."""
    from registry.lifecycle import CanaryStoppedByHand

    stopped = _by_hand(business_line, CanaryStoppedByHand(reason or "canary cleared by hand"))
    champion = stopped.table.champion or "the base model"
    out.print(f"{business_line}: no canary; all users on {champion} ({stopped.reason})")


@routes_app.callback(invoke_without_command=True)
def routes_show(
    ctx: typer.Context,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    history: Annotated[
        str | None, typer.Option(help="Show this line's latest routing changes instead.")
    ] = None,
) -> None:
    """The routing table of every business line (champion, canary, share, previous)."""
    if ctx.invoked_subcommand is not None:
        return
    settings = load_settings()
    routes = clients(settings).routes
    if history is not None:
        _print_history(routes, history, as_json=as_json)
        return
    snapshot = routes.snapshot()
    lines = sorted(set(settings.business_lines) | snapshot.tables.keys())
    if as_json:
        rows = [
            {**snapshot.table(line).model_dump(), "revision": snapshot.revisions.get(line, 0)}
            for line in lines
        ]
        out.print_json(orjson.dumps(rows).decode())
        return
    table = Table("business line", "champion", "canary", "share", "previous", "revision")
    for line in lines:
        route = snapshot.table(line)
        table.add_row(
            line,
            route.champion or "(base model)",
            route.canary or "-",
            f"{route.canary_fraction:.1%}" if route.canary else "-",
            route.previous or "-",
            str(snapshot.revisions.get(line, 0)),
        )
    out.print(table)


def _print_history(routes: object, line: str, *, as_json: bool) -> None:
    from registry.routes import RouteStore

    assert isinstance(routes, RouteStore)
    changes = routes.history(line)
    if as_json:
        rows = [
            {
                "revision": c.revision,
                "action": c.action,
                **c.table.model_dump(),
                "actor": c.actor,
                "reason": c.reason,
                "at": c.created_at.isoformat(),
            }
            for c in changes
        ]
        out.print_json(orjson.dumps(rows).decode())
        return
    table = Table("rev", "when (UTC)", "action", "champion", "canary", "share", "by", "reason")
    for change in changes:
        table.add_row(
            str(change.revision),
            change.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            change.action,
            change.table.champion or "(base)",
            change.table.canary or "-",
            f"{change.table.canary_fraction:.1%}" if change.table.canary else "-",
            change.actor,
            change.reason or "",
        )
    out.print(table)


@routes_app.command("sync")
def routes_sync() -> None:
    """Load (and probe) on every vLLM replica the adapters the routing tables name; unload
    flywheel adapters none names (after a replica restart, or to check)."""
    from registry.adapter_sync import sync_adapters

    settings = load_settings()
    summary = sync_adapters(settings, clients(settings), settings.gateway.upstreams)
    out.print_json(orjson.dumps(summary).decode())
    if any(replica["failed"] for replica in summary.values()):
        raise typer.Exit(1)


@routes_app.command("champion")
def routes_champion(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    adapter: Annotated[str, typer.Argument(help="<line>-v<version>, or 'base'.")],
    reason: Annotated[str, typer.Option(help="Why, for the routing history and MLflow.")] = (
        "set by hand"
    ),
) -> None:
    """Make ``adapter`` the line's champion by hand: loaded on every replica, then the routing
    table and MLflow's ``champion`` alias move together; the old one is kept as ``previous``."""
    from registry.lifecycle import ChampionSetByHand

    chosen = None if adapter == "base" else adapter
    transition = _by_hand(business_line, ChampionSetByHand(chosen, reason))
    out.print(
        f"{business_line}: champion {transition.table.champion or 'base model'} "
        f"({transition.reason})"
    )


@gateway_app.command("add-key")
def gateway_add_key(
    name: Annotated[str, typer.Argument(help="Who the key is for (shown in logs).")],
    lines: Annotated[
        str,
        typer.Option(
            help="Comma-separated business lines it may use, or '*' for all (needed unless "
            "--operator)."
        ),
    ] = "",
    review_lines: Annotated[
        str,
        typer.Option(
            help="Lines whose review queue it works on the feedback page (the reviewer role), "
            "comma-separated or '*'; none by default."
        ),
    ] = "",
    operator: Annotated[
        bool,
        typer.Option(
            "--operator",
            help="The operator role: the gateway's /metrics and its /healthz detail (every "
            "line's counts, adapters and routing revisions), e.g. for a Prometheus scrape.",
        ),
    ] = False,
) -> None:
    """Create an API key for the gateway; it is printed once (the file keeps a digest)."""
    from gateway.keys import add_key

    settings = load_settings()
    chosen = [line.strip() for line in lines.split(",") if line.strip()]
    if not chosen and not operator:
        raise UsageError("name the key's lines with --lines (or make it an --operator key)")
    for line in chosen:
        if line != "*":
            _check_line(settings, line)
    reviewing = [line.strip() for line in review_lines.split(",") if line.strip()]
    for line in reviewing:
        if line != "*":
            _check_line(settings, line)
    path = settings.gateway.resolved_keys_file(settings.home)
    token = add_key(path, name, chosen, reviewing, operator=operator)
    roles = [", ".join(chosen)] if chosen else []
    roles += [f"reviewer on {', '.join(reviewing)}"] if reviewing else []
    roles += ["operator"] if operator else []
    out.print(f"key for {name} ({'; '.join(roles)}), stored as a digest in {path}:")
    out.print(token, highlight=False)


@gateway_app.command("rotate-key")
def gateway_rotate_key(
    name: Annotated[str, typer.Argument(help="The key's name.")],
) -> None:
    """Give a key a new secret (printed once), keeping its name, lines and roles; the old
    secret stops working at the gateway's next read of the key file. Rotate rather than add
    a new key for the same client: its traffic stays one key's in the canary's bounds."""
    from gateway.keys import rotate_key

    settings = load_settings()
    path = settings.gateway.resolved_keys_file(settings.home)
    token = rotate_key(path, name)
    out.print(f"new secret for {name}, stored as a digest in {path} (the old one is void):")
    out.print(token, highlight=False)


def serve_gateway(
    port: Annotated[int, typer.Option(min=1, max=65_535, help="Port to listen on.")] = 8080,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "",
    upstream: Annotated[
        list[str] | None, typer.Option(help="A vLLM replica's root URL (repeatable).")
    ] = None,
    workers: Annotated[int, typer.Option(min=1, max=64, help="Server processes.")] = 1,
) -> None:
    """Run the gateway (OpenAI-compatible, per-line keys, sticky canary) with uvicorn."""
    import os

    from composition.clients import check_redis_url

    # Before the settings are read: the workers read the same variable, and so does the
    # start-up line below.
    if upstream:
        os.environ["FLYWHEEL_GATEWAY_UPSTREAMS"] = ",".join(upstream)
    settings = load_settings()
    gateway = settings.gateway
    keys = gateway.resolved_keys_file(settings.home)
    if not keys.exists():
        out.print(
            Text.assemble(
                ("no API keys yet", "yellow"),
                f" ({keys}): every request gets 401 until `flywheel gateway add-key` makes one",
            )
        )
    open_store(settings).close()
    check_redis_url(settings)
    if workers > 1 and not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        # Every worker's metrics in one /metrics: prometheus_client's multiprocess mode,
        # a fresh folder per run (the workers read the variable when they start).
        import shutil

        folder = settings.home / "metrics" / f"gateway-{port}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True, mode=0o700)
        os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(folder)
    bind = host or gateway.host
    out.print(
        f"gateway on http://{bind}:{port} in front of {', '.join(gateway.upstreams)}; "
        "metrics at /metrics (for an operator key: `flywheel gateway add-key NAME --operator`); "
        "Ctrl-C stops it"
    )
    _run_app("composition.servers:gateway_app", "gateway", bind, port, workers)


def _run_app(factory: str, name: str, host: str, port: int, workers: int) -> None:
    """Serve an app factory with uvicorn until Ctrl-C; say how long it ran."""
    import uvicorn

    from flywheel.http_guard import server_options

    started = time.monotonic()
    uvicorn.run(
        factory,
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level="warning",
        access_log=False,
        **server_options(),  # header size and time limits, before any route runs
    )
    out.print(f"{name} stopped after {time.monotonic() - started:.0f} s")


def serve_dashboard(
    port: Annotated[int | None, typer.Option(min=1, max=65_535, help="Port to listen on.")] = None,
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "",
    workers: Annotated[int, typer.Option(min=1, max=64, help="Server processes.")] = 1,
) -> None:
    """Run the feedback page (per-line signals, funnel, samples, routing, eval review)."""

    from dashboard.access import is_loopback

    settings = load_settings()
    dashboard = settings.dashboard
    keys = settings.gateway.resolved_keys_file(settings.home)
    open_store(settings).close()
    bind = host or dashboard.host
    listen = port or dashboard.port
    if not keys.exists():
        where = "" if is_loopback(bind) else " (other clients get 403)"
        out.print(
            Text.assemble(
                ("no API keys", "yellow"),
                f" ({keys}): the page is open to loopback clients only{where}; "
                "`flywheel gateway add-key` makes one",
            )
        )
    out.print(f"feedback page on http://{bind}:{listen}; Ctrl-C stops it")
    _run_app("composition.servers:dashboard_app", "feedback page", bind, listen, workers)


@canary_app.command("status")
def canary_status(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """The line's routing and its canary's latest decisions with their numbers."""
    from registry.decisions import latest_decisions

    settings = load_settings()
    _check_line(settings, business_line)
    store = open_store(settings)
    table = clients(settings).routes.table(business_line)
    decisions = latest_decisions(store.engine, business_line, limit=10)
    if as_json:
        rows = [{**d, "created_at": d["created_at"].isoformat()} for d in decisions]
        out.print_json(orjson.dumps({"routes": table.model_dump(), "decisions": rows}).decode())
        return
    out.print(
        f"{business_line}: champion {table.champion or 'base model'}, "
        + (f"canary {table.canary} on {table.canary_fraction:.1%}" if table.canary else "no canary")
        + (f", previous {table.previous}" if table.previous else "")
    )
    shown = Table("when (UTC)", "adapter", "share", "look", "action", "requests c/h")
    # The reason is the decision's numbers in words: shown whole, wrapped, never cut.
    shown.add_column("why", overflow="fold", ratio=1, min_width=30)
    for decision in decisions:
        numbers = decision["numbers"]
        shown.add_row(
            decision["created_at"].strftime("%Y-%m-%d %H:%M"),
            decision["adapter"],
            f"{decision['canary_fraction']:.0%}",
            str(decision["look"]),
            decision["action"],
            _requests(numbers),
            decision["reasons"],
        )
    out.print(shown)


def _requests(numbers: dict[str, object]) -> str:
    """Requests per arm of a decision (a shadow's: its pairs; a watched champion's: both)."""
    shadow = numbers.get("shadow")
    if isinstance(shadow, dict):
        return f"{shadow['pairs']} pairs"
    names = ("champion", "previous") if "previous" in numbers else ("canary", "champion")
    arms = [numbers.get(name) for name in names]
    return "/".join(str(a.get("requests", "-")) if isinstance(a, dict) else "-" for a in arms)


@shadow_app.command("set")
def shadow_set(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    adapter: Annotated[str, typer.Argument(help="The shadow adapter, <line>-v<version>.")],
    share: Annotated[
        float, typer.Option(min=0.0, max=1.0, help="Share of the champion's requests mirrored.")
    ] = 0.1,
    reason: Annotated[str | None, typer.Option(help="Why, for the routing history.")] = None,
    check: Annotated[
        bool,
        typer.Option(
            "--check/--no-check",
            help="Load and probe it where the line is placed first; --no-check changes the "
            "routing alone (vLLM and MLflow untouched).",
        ),
    ] = True,
) -> None:
    """Mirror ``share`` of the line's champion requests to ``adapter`` after each user's
    answer (loaded and probed first); its answers are stored, never returned (``flywheel
    canary shadow report``). A shadow it replaces is rolled back."""
    from registry.lifecycle import ShadowStartedByHand

    started = ShadowStartedByHand(adapter, share, reason or "shadow set by hand")
    table = _by_hand(business_line, started, check=check).table
    out.print(
        f"{business_line}: {table.shadow} answers {table.shadow_fraction:.1%} of the requests "
        f"{table.champion or 'the base model'} serves, in shadow"
    )


@shadow_app.command("clear")
def shadow_clear(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    reason: Annotated[
        str | None, typer.Option(help="Why, for the routing history and MLflow.")
    ] = None,
) -> None:
    """Stop mirroring the line's requests; the shadow is rolled back: its version rejected in
    MLflow with the reason, drained and unloaded."""
    from registry.lifecycle import ShadowStoppedByHand

    stopped = _by_hand(business_line, ShadowStoppedByHand(reason or "shadow cleared by hand"))
    out.print(f"{business_line}: no shadow ({stopped.reason})")


@shadow_app.command("report")
def shadow_report_command(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    users: Annotated[
        str | None,
        typer.Option(
            help="A user model (path/to/file.py:NAME or package.module:NAME) whose "
            "satisfied() judges both answers of every pair."
        ),
    ] = None,
) -> None:
    """The line's shadow against its champion on the same requests since it started: pairs,
    errors, output length, refusals, PII, how alike the answers are, and the decision the
    canary flow would take now (nothing is applied). With ``--users``, also how often those
    users would be satisfied by each answer (paired, with its interval)."""
    from datetime import UTC, datetime

    from composition.recipes import recipe_for
    from registry.shadow import judge_shadow, shadow_report

    settings = load_settings()
    _check_line(settings, business_line)
    store = open_store(settings)
    routes = clients(settings).routes
    table = routes.table(business_line)
    if table.shadow is None:
        raise UsageError(f"{business_line} has no shadow (flywheel canary shadow set)")
    report = shadow_report(
        store, table, routes.history(business_line, limit=500), datetime.now(UTC)
    )
    decision = judge_shadow(report, recipe_for(settings, business_line).rollout.shadow)
    judged = _shadow_judged_by_users(store, table, routes, users) if users else None
    if as_json:
        body = {
            "shadow": table.shadow,
            "share": table.shadow_fraction,
            "report": report.as_dict(),
            "decision": decision.action.value,
            "reasons": list(decision.reasons),
            "satisfied": judged,
        }
        out.print_json(orjson.dumps(body).decode())
        return
    _print_shadow_report(table, report, decision, judged, users)


def _print_shadow_report(
    table: RoutingTable,
    report: ShadowReport,
    decision: ShadowDecision,
    judged: dict[str, float | int | None] | None,
    users: str | None,
) -> None:
    out.print(
        f"{table.business_line}: {table.shadow} on {table.shadow_fraction:.1%} of the requests "
        f"of {table.champion or 'the base model'}; {report.pairs} pairs, {report.errors} errors"
    )
    for check in decision.checks:
        out.print(f"  {check.verdict:<8} {check.why}")
    if report.similarity_mean is not None:
        out.print(
            f"  answers alike: mean word overlap {report.similarity_mean:.2f}, "
            f"{report.identical} with the same words"
        )
    if judged is not None and not judged["pairs"]:
        out.print(f"  satisfied ({users}): no answered pairs yet")
    elif judged is not None:
        out.print(
            f"  satisfied ({users}, {judged['pairs']} pairs): champion "
            f"{judged['champion']:.1%}, shadow {judged['shadow']:.1%}, difference "
            f"{judged['difference']:+.1%} [{judged['low']:+.1%}, {judged['high']:+.1%}], "
            f"p {judged['p_value']:.2g} that the shadow satisfies more"
        )
    out.print(f"decision now: {decision.action.value}: {'; '.join(decision.reasons)}")


def _shadow_judged_by_users(
    store: FeedbackStore, table: RoutingTable, routes: RouteStore, spec: str
) -> dict[str, float | int | None]:
    """Both answers of each shadow pair scored by a user model's ``satisfied()``."""
    from datetime import UTC, datetime

    from feedback.shadow import shadow_answer_pairs
    from flywheel.named_objects import load_named_object
    from registry.lifecycle import shadow_since
    from registry.shadow import shadow_satisfaction

    model = load_named_object(spec, "--users")
    if not callable(getattr(model, "satisfied", None)):
        raise UsageError(f"--users {spec}: the object has no satisfied() method")
    line = table.business_line
    since = shadow_since(routes.history(line, limit=500), table)
    assert table.shadow is not None
    pairs = shadow_answer_pairs(
        store.engine,
        line,
        table.shadow,
        since or datetime.min.replace(tzinfo=UTC),
        datetime.now(UTC),
    )
    champion = [model.satisfied(line, p.prompt, p.champion) for p in pairs]
    shadow = [model.satisfied(line, p.prompt, p.shadow) for p in pairs]
    if not pairs:
        return {"pairs": 0, "champion": None, "shadow": None, "difference": None,
                "low": None, "high": None, "p_value": None}  # fmt: skip
    compared = shadow_satisfaction(champion, shadow)
    return {
        "pairs": len(pairs),
        "champion": sum(champion) / len(pairs),
        "shadow": sum(shadow) / len(pairs),
        "difference": compared.difference,
        "low": compared.low,
        "high": compared.high,
        "p_value": compared.p_value,
    }


def _judge(business_line: str, action: str | None, reason: str | None) -> None:
    from composition.rollout import judge_canary
    from registry.canary import CanaryAction
    from registry.vllm_admin import vllm_in_flight

    settings = load_settings()
    _check_line(settings, business_line)
    force = CanaryAction(action) if action else None
    gateway = settings.gateway
    outcome = judge_canary(
        settings,
        clients(settings),
        business_line,
        upstreams=gateway.upstreams,
        in_flight=vllm_in_flight(gateway.upstreams),
        force=force,
        reason=reason,
        actor=_actor(),
    )
    table = outcome.table
    where = f"champion {table.champion or 'base'}, canary {table.canary or '-'}" if table else ""
    out.print(f"{business_line}: {outcome.action}: {outcome.reason} ({where})")


@canary_app.command("promote")
def canary_promote(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    reason: Annotated[str, typer.Option(help="Why, recorded in MLflow and the routes.")] = (
        "promoted by hand"
    ),
) -> None:
    """Promote the canary now (next canary step, or champion alias and all traffic)."""
    _judge(business_line, "promote", reason)


@canary_app.command("rollback")
def canary_rollback(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
    reason: Annotated[str, typer.Option(help="Why, recorded in MLflow and the routes.")],
) -> None:
    """Roll the canary back now: no traffic at once, then drain and unload it."""
    _judge(business_line, "rollback", reason)


@canary_app.command("check")
def canary_check(
    business_line: Annotated[str, typer.Argument(help="The business line.")],
) -> None:
    """Run the canary decision once for the line (what the canary flow does every N minutes)."""
    _judge(business_line, None, None)


@lifecycle_app.command("check")
def lifecycle_check(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="First move MLflow's champion and canary aliases to what the routing table "
            "serves (the source of truth).",
        ),
    ] = False,
) -> None:
    """Per line: routing vs MLflow aliases vs the adapters each vLLM replica serves vs the
    LoRA budget. Exit 1 on any drift, saying what differs. ``--repair`` first makes the
    aliases follow the routing table (``flywheel routes sync`` brings the replicas)."""
    from registry.adapter_sync import lifecycle_check as check
    from registry.adapter_sync import repair_aliases

    settings = load_settings()
    repaired = []
    if repair:
        for line, moves in repair_aliases(settings, clients(settings)).items():
            repaired += [{"business_line": line, "alias": m.alias, "version": m.version}
                         for m in moves]  # fmt: skip
    report = check(settings, clients(settings), settings.gateway.upstreams)
    if as_json:
        out.print_json(orjson.dumps({**report, "repaired": repaired}).decode())
    else:
        for move in repaired:
            version = move["version"]
            where = f"now v{version}" if version is not None else "removed"
            out.print(f"{move['business_line']}: MLflow @{move['alias']} repaired: {where}")
        shown = Table("business line", "champion", "canary", "previous", "aliases", "drift")
        for line, row in report["lines"].items():
            routing = row["routing"]
            shown.add_row(
                line,
                routing["champion"] or "(base)",
                routing["canary"] or "-",
                routing["previous"] or "-",
                ", ".join(f"@{k}=v{v}" for k, v in sorted(row["aliases"].items())) or "-",
                "; ".join(row["drift"]) or "none",
            )
        out.print(shown)
        budget = report["budget"]
        out.print(f"LoRA budget: {budget['routed']} routed of --max-loras {budget['max_loras']}")
        for problem in report["problems"]:
            out.print(Text.assemble(("drift", "red"), f": {problem}"))
    if not report["ok"]:
        raise typer.Exit(1)
