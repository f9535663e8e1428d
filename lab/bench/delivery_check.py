"""Adapters reach vLLM replicas that share no disk with the trainer: the whole route, once.

Run from the repository root (minutes of CPU; vLLM on the CPU is slow)::

    python lab/bench/delivery_check.py --out lab/bench/results/delivery

What it starts, each in its own folder (no path shared between trainer and replicas):

- an ``mlflow server`` with a SQLite backend and proxied artifacts
  (``--serve-artifacts --artifacts-destination``) on a free local port;
- a fresh PostgreSQL database as the feedback store (routing tables, replica records):
  a service every process reaches over the network, like the MLflow server;
- a trainer home that makes tiny adapters of the bundled base model (peft's LoRA
  initialisation, saved unchanged, plus the base it was made on), registers them through
  the MLflow server, then deletes its adapter folders;
- two vLLM replicas, each ``flywheel serve vllm --max-loras 2`` with its own
  ``FLYWHEEL_HOME`` (its own copy of the base model and its own adapter cache);
- ``flywheel serve gateway`` in front of both.

Then, each step's outcome in the JSON under ``--out``:

1. each replica serves ``customer_service-v1`` on the first request naming it (its
   resolver fetches it from the registry): status and seconds per replica;
2. ``flywheel canary set`` of v1 at 5%, ``flywheel canary promote`` until it is the
   champion; v2 on a 5% canary, requests through the gateway by distinct users (the share
   the store recorded on v2), then ``flywheel canary rollback``;
3. the limits: with v1 champion and v2 canary routed (two adapters), a third routed
   adapter (``flywheel canary shadow set`` of v4) on replicas started with ``--max-loras
   2``: refused with the reason, or not (said plainly);
4. replica A stopped and started again while requests flow through the gateway: failed
   requests (the target is zero), and A's first direct request for the champion after it;
5. a byte of v3's artifact changed in the MLflow server's store: both replicas refuse it
   (404) and their logs say why (the digest);
6. ``legal-v1``, recorded as trained on another base model: both replicas refuse it and
   their logs name both bases.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from flywheel.processes import stop_process_group

REPO = Path(__file__).resolve().parents[2]
LINE = "customer_service"
OTHER_LINE = "legal"
FLYWHEEL = Path(sys.executable).with_name("flywheel")
PROMPT = "Where is my parcel?"
POSTGRES_ADMIN_URL = os.environ.get(
    "FLYWHEEL_TEST_POSTGRES_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _clean_env(extra: Mapping[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLYWHEEL_", "VLLM_"))}
    env.update({"MLFLOW_DISABLE_TELEMETRY": "true", "COLUMNS": "200", **extra})
    return env


@dataclass
class Service:
    """One long-running process of the check, its log and how to stop it."""

    name: str
    argv: list[str]
    env: dict[str, str]
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        handle = self.log.open("ab")
        self.process = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
            cwd=REPO,
        )
        handle.close()

    def stop(self, grace_s: float = 60.0) -> None:
        process, self.process = self.process, None
        if process is not None:
            stop_process_group(process, grace_s=grace_s, name=self.name)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return ""


def _wait_http(url: str, service: Service, timeout_s: float) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if service.process is not None and service.process.poll() is not None:
            raise RuntimeError(f"{service.name} exited while starting:\n{service.tail()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=5).status_code == 200:
                return time.monotonic() - started
        time.sleep(1.0)
    raise RuntimeError(
        f"{service.name} did not answer {url} in {timeout_s:.0f} s:\n{service.tail()}"
    )


def _run(argv: Sequence[str], env: Mapping[str, str], timeout_s: float = 600) -> dict[str, Any]:
    """One flywheel command: its exit code and output, for the record."""
    started = time.monotonic()
    done = subprocess.run(
        list(argv), capture_output=True, text=True, env=dict(env), timeout=timeout_s, cwd=REPO,
        check=False,
    )  # fmt: skip
    return {
        "argv": " ".join(argv[1:]) if argv[0] == str(FLYWHEEL) else " ".join(argv),
        "exit": done.returncode,
        "stdout": done.stdout.strip()[-2_000:],
        "stderr": done.stderr.strip()[-2_000:],
        "seconds": round(time.monotonic() - started, 1),
    }


@dataclass
class Record:
    """What the check found, step by step; written as JSON."""

    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    steps: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    not_shown: list[str] = field(default_factory=list)

    def step(self, name: str, **found: Any) -> None:
        self.steps[name] = found
        print(f"[{datetime.now(UTC):%H:%M:%S}] {name}: {json.dumps(found, default=str)[:600]}")

    def expect(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)
            print(f"  FAILED: {what}")


# --- the trainer: tiny adapters of the base model, registered, then deleted ----------------


def make_adapter(base: Path, folder: Path, seed: int, trained_on: Any = None) -> Path:
    """A LoRA adapter of ``base`` as peft initialises it (rank 8 on the attention
    projections), saved with the base fingerprint it was made on (or ``trained_on``)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from training.base_model import base_fingerprint, write_base_record

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32)
    config = LoraConfig(
        r=8, lora_alpha=16, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
        lora_dropout=0.0, task_type="CAUSAL_LM",
    )  # fmt: skip
    peft_model = get_peft_model(model, config)
    # peft starts lora_B at zero (the adapter answers as the base); a small B makes each
    # adapter's weights, and digest, its own.
    with torch.no_grad():
        for name, weights in peft_model.named_parameters():
            if "lora_B" in name:
                weights.normal_(0.0, 1e-4)
    peft_model.save_pretrained(folder)
    write_base_record(folder, trained_on or base_fingerprint(base))
    return folder


def register(settings: Any, registry: Any, line: str, adapter: Path, work: Path) -> int:
    """Log ``adapter`` in a finished training run of ``line`` and register it (the line's
    candidate), as the nightly flow leaves a version."""
    from composition.recipes import (
        load_recipe,
        packaged_recipes_dir,
        recipe_hash,
        start_training_run,
    )

    recipe = load_recipe(line, settings.recipes_dir or packaged_recipes_dir())
    marker = uuid.uuid4().hex
    manifest = work / "datasets" / marker / "manifest.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"business_line": line, "content_hash": marker}))
    run_id = start_training_run(registry, recipe, marker, manifest, "base", "delivery-check")
    registry.log_adapter(run_id, adapter)
    lineage = {
        "base_model": "base",
        "dataset_hash": marker,
        "recipe_hash": recipe_hash(recipe),
        "code_version": "delivery-check",
    }
    version = int(registry.register_adapter(run_id, line, lineage))
    registry.finish_run(run_id)
    registry.set_candidate(line, version)
    return version


# --- requests -----------------------------------------------------------------------------


def ask_replica(url: str, model: str, max_tokens: int) -> tuple[int, float, str]:
    """One chat request straight to a replica naming ``model``: status, seconds, body."""
    started = time.monotonic()
    try:
        response = httpx.post(
            f"{url}/v1/chat/completions",
            json={
                "model": model,
                "messages": [{"role": "user", "content": PROMPT}],
                "max_tokens": max_tokens,
                "temperature": 0,
            },
            timeout=600,
        )
    except httpx.HTTPError as exc:
        return 0, time.monotonic() - started, type(exc).__name__
    return response.status_code, time.monotonic() - started, response.text[:300]


def ask_gateway(gateway: str, key: str, user: str, max_tokens: int) -> int:
    """One chat request through the gateway for ``user``; its HTTP status (0: no answer)."""
    try:
        response = httpx.post(
            f"{gateway}/v1/chat/completions",
            headers={"Authorization": f"Bearer {key}"},
            json={
                "model": LINE,
                "messages": [{"role": "user", "content": PROMPT}],
                "user": user,
                "max_tokens": max_tokens,
                "temperature": 0,
            },
            timeout=600,
        )
    except httpx.HTTPError:
        return 0
    return response.status_code


@contextlib.contextmanager
def traffic(gateway: str, key: str, max_tokens: int) -> Iterator[list[int]]:
    """Requests through the gateway, one after another, until the block ends."""
    statuses: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        n = 0
        while not stop.is_set():
            statuses.append(ask_gateway(gateway, key, f"restart-user-{n}", max_tokens))
            n += 1

    worker = threading.Thread(target=loop, daemon=True)
    worker.start()
    try:
        yield statuses
    finally:
        stop.set()
        worker.join(timeout=600)


def log_lines(path: Path, *needles: str) -> list[str]:
    """The lines of ``path`` holding every one of ``needles``."""
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        return []
    return [line.strip()[-400:] for line in text.splitlines() if all(n in line for n in needles)]


def served_adapters(database_url: str, since: datetime) -> dict[str, int]:
    """Requests the gateway recorded per adapter since ``since`` (the store's own count)."""
    from sqlalchemy import create_engine, func, select

    from feedback.schema import interactions_table as table

    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                select(table.c.adapter_name, func.count())
                .where(table.c.created_at >= since)
                .group_by(table.c.adapter_name)
            ).all()
    finally:
        engine.dispose()
    return {str(name or "base"): int(count) for name, count in rows}


# --- the check ----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "lab" / "bench" / "results" / "delivery")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--canary-requests", type=int, default=40)
    parser.add_argument("--start-timeout-s", type=float, default=900.0)
    args = parser.parse_args(argv)
    out: Path = args.out.resolve()
    work = out / "work"
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    record = Record()
    services: list[Service] = []
    database = f"flywheel_delivery_{uuid.uuid4().hex[:10]}"
    try:
        _check(args, work, record, services, database)
    # The record says where the check stopped, whatever stopped it.
    except Exception as exc:
        record.failures.append(f"the check stopped: {type(exc).__name__}: {exc}"[:2_000])
        print(f"STOPPED: {exc}")
    finally:
        for service in reversed(services):
            service.stop()
        _drop_database(database)
        record.steps.setdefault("logs", {s.name: str(s.log) for s in services})
        result = out / "delivery-check.json"
        result.write_text(json.dumps(record.__dict__, indent=2, default=str) + "\n")
        print(f"\n{len(record.failures)} failed; written {result}")
        for failure in record.failures:
            print(f"  - {failure[:300]}")
    return 1 if record.failures else 0


def _create_database(name: str) -> str:
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as connection:
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    url = make_url(POSTGRES_ADMIN_URL).set(database=name)
    return url.render_as_string(hide_password=False)


def _drop_database(name: str) -> None:
    from sqlalchemy import create_engine, text

    admin = create_engine(POSTGRES_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with contextlib.suppress(Exception), admin.connect() as connection:
        connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


def _check(
    args: argparse.Namespace,
    work: Path,
    record: Record,
    services: list[Service],
    database: str,
) -> None:
    from flywheel.settings import load_settings
    from registry.tracking import Registry
    from registry.vllm_server import VllmEnvironment
    from training.base_model import BaseFingerprint, ensure_base_model

    # vLLM's virtualenv (with flywheel's resolver) is built before anything is timed.
    VllmEnvironment(REPO / ".venv-vllm", report=print).ensure()
    cache = REPO / ".cache"
    cache.mkdir(exist_ok=True)
    (cache / ".gitignore").write_text("*\n")
    bundled = ensure_base_model(cache / "models")
    database_url = _create_database(database)

    # MLflow with proxied artifacts: replicas reach the files only through it.
    mlflow_port = _free_port()
    mlflow_url = f"http://127.0.0.1:{mlflow_port}"
    artifacts = work / "mlflow" / "artifacts"
    mlflow = Service(
        "mlflow",
        [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", f"sqlite:///{work / 'mlflow' / 'mlflow.db'}",
            "--serve-artifacts", "--artifacts-destination", str(artifacts),
            "--host", "127.0.0.1", "--port", str(mlflow_port), "--workers", "1",
        ],
        _clean_env({}),
        work / "logs" / "mlflow.log",
    )  # fmt: skip
    (work / "mlflow").mkdir(parents=True)
    services.append(mlflow)
    mlflow.start()
    _wait_http(f"{mlflow_url}/health", mlflow, 180)

    ports = {"a": _free_port(), "b": _free_port()}
    urls = {name: f"http://127.0.0.1:{port}" for name, port in ports.items()}
    gateway_port = _free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    shared = {
        "FLYWHEEL_DATABASE_URL": database_url,
        "FLYWHEEL_MLFLOW_TRACKING_URI": mlflow_url,
        "FLYWHEEL_GATEWAY_UPSTREAMS": ",".join(urls.values()),
    }

    # The trainer: adapters made, registered through the server, then deleted.
    trainer_home = work / "trainer"
    trainer_env = _clean_env({**shared, "FLYWHEEL_HOME": str(trainer_home)})
    os.environ.update(
        {k: v for k, v in trainer_env.items() if k.startswith(("FLYWHEEL_", "MLFLOW_"))}
    )
    settings = load_settings()
    registry = Registry(mlflow_url, None, download_dir=trainer_home / "downloads")
    made = trainer_home / "adapters"
    other_base = BaseFingerprint("Qwen2.5-0.5B-Instruct", "sha256:" + "0" * 64)
    versions: dict[str, int] = {}
    started = time.monotonic()
    for seed, (line, trained_on) in enumerate(
        [(LINE, None), (LINE, None), (LINE, None), (LINE, None), (OTHER_LINE, other_base)], 1
    ):
        folder = make_adapter(bundled, made / f"{line}-{seed}", seed, trained_on)
        version = register(settings, registry, line, folder, trainer_home)
        versions[f"{line}-v{version}"] = version
    shutil.rmtree(made)
    record.step(
        "trainer",
        registered=sorted(versions),
        seconds=round(time.monotonic() - started, 1),
        adapter_folders_left=made.exists(),
        artifact_location=registry.adapter_source(LINE, 1),
    )
    record.expect(not made.exists(), "the trainer's adapter folders are deleted")
    v1, v2, v3, v4 = (f"{LINE}-v{n}" for n in (1, 2, 3, 4))
    other = f"{OTHER_LINE}-v1"

    # The operator: the store's schema and a gateway key.
    operator_home = work / "operator"
    operator_env = _clean_env({**shared, "FLYWHEEL_HOME": str(operator_home)})
    record.expect(_run([str(FLYWHEEL), "db", "upgrade"], operator_env)["exit"] == 0, "db upgrade")
    key_run = _run([str(FLYWHEEL), "gateway", "add-key", "check", "--lines", LINE], operator_env)
    key = key_run["stdout"].splitlines()[-1].strip()

    # Two replicas, each with its own home, base model copy and adapter cache.
    replicas: dict[str, Service] = {}
    for name, port in ports.items():
        home = work / f"replica-{name}"
        base = home / "models" / bundled.name
        shutil.copytree(bundled, base)
        env = _clean_env(
            {
                **shared,
                "FLYWHEEL_HOME": str(home),
                "FLYWHEEL_BASE_MODEL": str(base),
                "FLYWHEEL_VLLM_KV_CACHE_GIB": "1",
                "FLYWHEEL_VLLM_START_TIMEOUT_S": str(args.start_timeout_s),
                "FLYWHEEL_VLLM_MAX_MODEL_LEN": "512",
            }
        )
        replicas[name] = Service(
            f"replica-{name}",
            [str(FLYWHEEL), "serve", "vllm", "--port", str(port), "--max-loras", "2",
             "--url", urls[name], "--venv", str(REPO / ".venv-vllm")],
            env,
            work / "logs" / f"replica-{name}.log",
        )  # fmt: skip
        services.append(replicas[name])
    startup: dict[str, float] = {}
    for name, replica in replicas.items():
        replica.start()
        startup[name] = round(_wait_http(f"{urls[name]}/health", replica, args.start_timeout_s), 1)
    vllm_logs = {
        name: work / f"replica-{name}" / "logs" / f"vllm-{ports[name]}.log" for name in ports
    }
    # No path of the trainer's reaches a replica: not in its environment, not in its home.
    trainer_paths_seen = sorted(
        f"{name}: {key}"
        for name, replica in replicas.items()
        for key, value in replica.env.items()
        if str(trainer_home) in value or str(bundled) in value
    )
    record.step(
        "replicas started", seconds=startup, trainer_paths_in_replica_env=trainer_paths_seen,
        homes={name: str(work / f"replica-{name}") for name in ports},
    )  # fmt: skip
    record.expect(not trainer_paths_seen, "no trainer path in a replica's environment")

    gateway = Service(
        "gateway",
        [str(FLYWHEEL), "serve", "gateway", "--port", str(gateway_port)],
        _clean_env({**shared, "FLYWHEEL_HOME": str(operator_home)}),
        work / "logs" / "gateway.log",
    )
    services.append(gateway)
    gateway.start()
    _wait_http(f"{gateway_url}/healthz", gateway, 180)

    # 1. The resolver: each replica serves v1 on the first request naming it.
    first: dict[str, Any] = {}
    for name, url in urls.items():
        status, seconds, body = ask_replica(url, v1, args.max_tokens)
        again, seconds_again, _ = ask_replica(url, v1, args.max_tokens)
        first[name] = {
            "status": status, "seconds": round(seconds, 1),
            "second_request": again, "second_seconds": round(seconds_again, 1),
            "fetched_into": str(work / f"replica-{name}" / "adapter-cache" / v1),
            "in_cache": (work / f"replica-{name}" / "adapter-cache" / v1).is_dir(),
            "body": body if status != 200 else "",
        }  # fmt: skip
        record.expect(status == 200, f"replica {name} serves {v1} on its first request")
    record.step("resolver: first request per replica", **first)

    # 2. Rollout through the CLI: v1 on a 5% canary, promoted to champion.
    cli: list[dict[str, Any]] = []
    cli.append(_run([str(FLYWHEEL), "canary", "set", LINE, v1, "--fraction", "0.05"], operator_env))
    for _ in range(8):
        step = _run([str(FLYWHEEL), "canary", "promote", LINE, "--reason", "delivery check"],
                    operator_env)  # fmt: skip
        cli.append(step)
        if f"champion {v1}" in step["stdout"] and "canary -" in step["stdout"]:
            break
    routes = _run([str(FLYWHEEL), "routes", "--json"], operator_env)
    champion = _table(routes).get("champion")
    record.expect(champion == v1, f"{v1} promoted to champion through the CLI (got {champion})")

    # v2 on a 5% canary: each replica fetches it on its first request, users split.
    for url in urls.values():
        ask_replica(url, v2, args.max_tokens)
    cli.append(_run([str(FLYWHEEL), "canary", "set", LINE, v2, "--fraction", "0.05"], operator_env))
    since = datetime.now(UTC)
    statuses = [
        ask_gateway(gateway_url, key, f"canary-user-{n}", args.max_tokens)
        for n in range(args.canary_requests)
    ]
    time.sleep(5)  # the gateway writes its records in batches
    shares = served_adapters(database_url, since)
    routed = _table(_run([str(FLYWHEEL), "routes", "--json"], operator_env))
    expected: dict[str, int] = {}
    with contextlib.suppress(ValueError, TypeError):
        from registry.routing import RoutingTable, choose_arm

        table = RoutingTable(**{k: v for k, v in routed.items() if k != "revision"})
        for n in range(args.canary_requests):
            _, adapter = choose_arm(table, f"canary-user-{n}")
            expected[str(adapter)] = expected.get(str(adapter), 0) + 1
    record.step(
        "canary at 5%",
        requests=len(statuses), failed=sum(s != 200 for s in statuses), served=shares,
        expected_by_user_split=expected, table=routed,
    )  # fmt: skip
    record.expect(all(s == 200 for s in statuses), "every canary-phase request answered")

    # 3. The limits: a third routed adapter on replicas started with --max-loras 2.
    third = _run(
        [str(FLYWHEEL), "canary", "shadow", "set", LINE, v4, "--share", "0.1"], operator_env
    )
    lifecycle = _run([str(FLYWHEEL), "lifecycle", "check", "--json"], operator_env)
    budget = {}
    with contextlib.suppress(ValueError, KeyError):
        budget = json.loads(lifecycle["stdout"])["budget"]
    refused = third["exit"] != 0
    record.step(
        "limits: third routed adapter on --max-loras 2",
        command=third, refused=refused, lifecycle_budget=budget,
    )  # fmt: skip
    record.expect(refused, f"a third routed adapter ({v4}) refused on --max-loras 2 replicas")
    if not refused:
        cli.append(_run([str(FLYWHEEL), "canary", "shadow", "clear", LINE], operator_env))

    cli.append(_run([str(FLYWHEEL), "canary", "rollback", LINE, "--reason", "delivery check"],
                    operator_env))  # fmt: skip
    after = _table(_run([str(FLYWHEEL), "routes", "--json"], operator_env))
    record.expect(after.get("canary") is None and after.get("champion") == v1,
                  f"rollback leaves {v1} champion without a canary (got {after})")  # fmt: skip
    record.step("rollout through the CLI", commands=cli, table_after=after)

    # 4. Replica A restarted while requests flow through the gateway.
    restart: dict[str, Any] = {}
    with traffic(gateway_url, key, args.max_tokens) as flowing:
        time.sleep(5)
        replicas["a"].stop()
        restart["stopped_after_requests"] = len(flowing)
        began = time.monotonic()
        replicas["a"].start()
        restart["start_seconds"] = round(
            _wait_http(f"{urls['a']}/health", replicas["a"], args.start_timeout_s), 1
        )
        status, seconds, body = ask_replica(urls["a"], v1, args.max_tokens)
        restart["first_request_after"] = {"status": status, "seconds": round(seconds, 1)}
        restart["registered_at_start"] = log_lines(
            replicas["a"].log, "registering", "routed adapters at start"
        )[-1:]
        time.sleep(5)
        restart["down_seconds"] = round(time.monotonic() - began, 1)
    restart["requests"] = len(flowing)
    restart["failed"] = sum(s != 200 for s in flowing)
    restart["statuses"] = {str(s): flowing.count(s) for s in sorted(set(flowing))}
    record.step("restart under traffic", **restart)
    record.expect(restart["failed"] == 0, "zero failed requests while replica A restarted")
    record.expect(status == 200, f"replica A serves {v1} on its first request after restart")

    # 5. A corrupted artifact: refused by its digest on both replicas.
    weights = _artifact_file(artifacts, registry.adapter_source(LINE, versions[v3]))
    data = bytearray(weights.read_bytes())
    data[200] ^= 0x01
    weights.write_bytes(bytes(data))
    corrupt: dict[str, Any] = {}
    for name, url in urls.items():
        status, _, body = ask_replica(url, v3, args.max_tokens)
        corrupt[name] = {
            "status": status, "body": body,
            "log": log_lines(vllm_logs[name], "flywheel resolver", v3)[-1:],
            "cache_left": _listing(work / f"replica-{name}" / "adapter-cache"),
        }  # fmt: skip
        record.expect(status == 404, f"replica {name} refuses the corrupted {v3}")
        record.expect(any("digest" in line for line in corrupt[name]["log"]),
                      f"replica {name}'s log says {v3}'s digest differs")  # fmt: skip
    record.step("corrupted artifact", **corrupt)

    # 6. Another base model: refused by both replicas with the reason.
    refused_base: dict[str, Any] = {}
    for name, url in urls.items():
        status, _, body = ask_replica(url, other, args.max_tokens)
        refused_base[name] = {
            "status": status, "body": body,
            "log": log_lines(vllm_logs[name], "flywheel resolver", other)[-1:],
        }  # fmt: skip
        record.expect(status == 404, f"replica {name} refuses {other} (another base)")
        record.expect(any("Qwen2.5-0.5B-Instruct" in line for line in refused_base[name]["log"]),
                      f"replica {name}'s log names the other base")  # fmt: skip
    record.step("another base model", **refused_base)
    record.not_shown.append(
        "GPU: this machine has none; vLLM ran on 2 CPU cores with max_tokens "
        f"{args.max_tokens}, so the seconds here are CPU seconds, not serving numbers"
    )


def _listing(folder: Path) -> list[str]:
    return sorted(path.name for path in folder.iterdir()) if folder.is_dir() else []


def _table(routes: dict[str, Any]) -> dict[str, Any]:
    with contextlib.suppress(ValueError):
        for row in json.loads(routes["stdout"]):
            if row.get("business_line") == LINE:
                return dict(row)
    return {}


def _artifact_file(artifacts: Path, source: str) -> Path:
    """The weights file the MLflow server stores for the artifact URI ``source``
    (``mlflow-artifacts:/<path>`` is ``<path>`` under ``--artifacts-destination``)."""
    relative = source.removeprefix("mlflow-artifacts:").lstrip("/")
    [weights] = (artifacts / relative).rglob("adapter_model.safetensors")
    return weights


if __name__ == "__main__":
    sys.exit(main())
