"""The loop's real services on this machine: vLLM on the CPU, the gateway, the Prefect flows.

:func:`live_services` starts vLLM (its own virtualenv) and the gateway as child
processes, points the flows at them and yields the :class:`LoopServices` that
``flywheel loop`` and ``flywheel demo`` drive. Everything stops when the block
ends, a SIGTERM included.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from flywheel.install import vllm_venv
from flywheel.processes import service_process
from flywheel.settings import Settings
from flywheel.wording import in_words
from lab.simulation.loop import CanaryResult, LoopServices, NightlyResult

if TYPE_CHECKING:
    from composition.clients import Clients


@contextmanager
def gateway_process(settings: Settings, upstream: str, port: int, log_path: Path) -> Iterator[str]:
    """The gateway as its own process (uvicorn), in front of ``upstream``; yields its URL."""
    env = {
        **os.environ,
        "FLYWHEEL_HOME": str(settings.home),
        "FLYWHEEL_GATEWAY_UPSTREAMS": upstream,
    }
    argv = [
        sys.executable, "-m", "uvicorn", "composition.servers:gateway_app", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with service_process(
        argv, name="the gateway", ready_url=f"{url}/healthz", log_path=log_path, env=env
    ):
        yield url


@contextmanager
def dashboard_process(settings: Settings, port: int, log_path: Path) -> Iterator[str]:
    """The feedback page as its own process (uvicorn), for simulated reviewers; yields its
    URL."""
    env = {
        **os.environ,
        "FLYWHEEL_HOME": str(settings.home),
        **({"FLYWHEEL_RECIPES_DIR": str(settings.recipes_dir)} if settings.recipes_dir else {}),
    }
    argv = [
        sys.executable, "-m", "uvicorn", "composition.servers:dashboard_app", "--factory",
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", "--no-access-log",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with service_process(
        argv, name="the feedback page", ready_url=f"{url}/healthz", log_path=log_path, env=env
    ):
        yield url


def flow_nightly(
    clients: Clients, bad_canary: Callable[[], bool] = lambda: False
) -> Callable[[str], NightlyResult]:
    """The nightly Prefect flow for one line, as the loop calls it.

    When ``bad_canary()`` says so, the night's candidate is instead trained on
    inverted preferences and put on the canary without the offline gate (which
    would rightly refuse it), so the canary flow has to catch it online; that
    training and deploy go through ``clients`` (a flow run builds its own).
    """

    def run(line: str) -> NightlyResult:
        from flows.nightly import run_nightly

        row = run_nightly(lines=[line])[0]
        if not bad_canary():
            return NightlyResult(
                row["status"], row["reason"], row["version"], row["adapter"], row["seconds"]
            )
        return _deploy_inverted(clients, line)

    return run


def _deploy_inverted(clients: Clients, line: str) -> NightlyResult:
    from composition.line_training import train_line
    from composition.rollout import deploy_canary, rollout
    from flywheel.settings import load_settings
    from registry.lifecycle import CanaryStoppedByHand

    settings = load_settings()
    parts = rollout(settings, clients, line, settings.gateway.upstreams, actor="loop --bad-canary")
    state = parts.state()
    if state.table.canary is not None:
        # Tonight's canary is the inverted adapter: a canary already live (the nightly's own
        # candidate just deployed, or one still undecided from an earlier day, which makes the
        # nightly keep it: rollout.on_live_canary) would keep it waiting and be judged instead.
        # Stopped through the lifecycle, like a canary taken out by hand: route cleared,
        # version rejected, unloaded.
        reason = f"{state.table.canary} replaced by an adapter trained on inverted preferences"
        parts.apply(state, parts.advance(state, CanaryStoppedByHand(reason)))
    trained = train_line(settings, clients, line, invert_preferences=True)
    if trained.version is None:
        return NightlyResult("skipped", f"no inverted adapter: {trained.reason}")
    deployed = deploy_canary(settings, clients, line, trained.version, settings.gateway.upstreams)
    return NightlyResult(
        "deployed" if deployed.status == "canary" else "failed",
        f"trained on inverted preferences (--bad-canary), gate bypassed; {deployed.reason}",
        trained.version,
        deployed.adapter,
    )


def flow_canary(line: str) -> CanaryResult:
    """The canary Prefect flow for one line."""
    from flows.canary import canary_watch

    row = canary_watch(lines=[line])[0]
    return CanaryResult(row["action"], row["reason"])


@contextmanager
def live_services(
    settings: Settings,
    clients: Clients,
    *,
    report: Callable[[str], None],
    bad_canary: Callable[[], bool] = lambda: False,
    reviewers: int = 0,
) -> Iterator[LoopServices]:
    """vLLM and the gateway up, the flows pointed at them; yields the loop's services. With
    ``reviewers``, the feedback page too and that many keys with the reviewer role."""
    from flows.prefect_env import configure_prefect
    from registry.adapter_sync import sync_adapters
    from registry.vllm_server import VllmEnvironment, VllmServer, VllmServerSettings, free_port
    from training.base_model import ensure_base_model

    base = ensure_base_model(settings.models_dir, settings.base_model)
    python = VllmEnvironment(
        vllm_venv(settings.home), torch_index=settings.torch_index, report=report
    ).ensure()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    logs = settings.home / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    vllm = VllmServerSettings(model=base, port=free_port(), served_model_name=base.name)
    keys = settings.gateway.resolved_keys_file(settings.home)
    # One application's users across runs on a home: the same key, rotated, as a client
    # would keep its key (a new name each run made a canary judged across two runs count
    # one key's answers against the other's: the look's per-key bound).
    key = _key(keys, "loop-users", ["*"])
    reviewer_keys = tuple(_key(keys, f"loop-reviewer-{n}", ["*"], ["*"]) for n in range(reviewers))
    with (
        VllmServer(vllm, python=python, log_path=logs / "loop-vllm.log", report=report) as llm,
        gateway_process(settings, llm.base_url, free_port(), logs / "loop-gateway.log") as url,
        contextlib.ExitStack() as stack,
    ):
        review_url = None
        if reviewer_keys:
            page_log = logs / "loop-dashboard.log"
            review_url = stack.enter_context(dashboard_process(settings, free_port(), page_log))
        # The flows read their settings from the environment, like a scheduled run would.
        os.environ.update(
            FLYWHEEL_HOME=str(settings.home),
            FLYWHEEL_GATEWAY_UPSTREAMS=llm.base_url,
            **({"FLYWHEEL_RECIPES_DIR": str(settings.recipes_dir)} if settings.recipes_dir else {}),
        )
        synced = sync_adapters(settings, clients, [llm.base_url])
        changes = {url: {k: v for k, v in done.items() if v} for url, done in synced.items()}
        shown = {url: done or "nothing to change" for url, done in changes.items()}
        report(f"adapters the routing tables name, loaded and probed: {in_words(shown)}")
        configure_prefect(settings)
        yield LoopServices(
            gateway_url=url,
            api_key=key,
            vllm_url=llm.base_url,
            base_model=base.name,
            nightly=flow_nightly(clients, bad_canary),
            canary=flow_canary,
            routes=clients.routes.table,
            review_url=review_url,
            reviewer_keys=reviewer_keys,
        )


def _key(path: Path, name: str, lines: list[str], review_lines: Sequence[str] = ()) -> str:
    """The secret of the key ``name``: rotated when the file has it, else made."""
    from flywheel.errors import UsageError
    from gateway.keys import add_key, rotate_key

    try:
        return rotate_key(path, name)
    except UsageError:
        return add_key(path, name, lines, review_lines)
