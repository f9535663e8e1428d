"""What the gateway adds over calling vLLM directly, beside LiteLLM's proxy, in one run.

    .venv/bin/python lab/bench/gateway_bench.py [--seconds 15] [--rounds 2] [--no-litellm]
        [--streams 1,16,64] [--baseline REV]

Four ways to the same server, measured in interleaved rounds so machine noise
hits them alike: **direct** (the client calls the server), **flywheel** (through
the gateway as ``flywheel serve gateway`` runs it: header guards, key check,
request checks, routing, SSE relay, logging to its SQLite store in the
background), **flywheel+limits+shadow** (the same with rate limits on the key
and the line — requests, tokens, concurrent streams — counted in Redis when one
answers at 127.0.0.1:6379, set high enough that nothing is refused, so every
request pays for the checks — and a shadow adapter answering ``--shadow`` (10%)
of the requests again after the user's answer, stored beside them) and
**litellm** (LiteLLM's proxy, in its own virtualenv built from PyPI on first
use). Every request is a streamed chat completion; latency is to
the last byte, TTFT to the first. For each of 1, 16 and 64 concurrent streams
it prints p50/p99 and throughput per path, and the added p50/p99 and the
throughput ratio against direct.

Two servers: a real vLLM on the CPU (the base model, a few tokens per answer)
and an instant OpenAI-compatible stand-in (``tests/stub_vllm.py``). The
stand-in's latency is near zero, so the proxy's own cost is not buried in
vLLM's run-to-run noise; vLLM shows it under a real load. The split check (100,000
users on a 5% canary) is printed too. Results go to ``lab/bench/results/``.

``--baseline REV`` adds the gateway of an older commit (both paths, from ``git archive
REV``, run with that tree first on the path) to the same interleaved rounds, so a change
to the hot path is compared with what it replaced on the same machine at the same time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from flywheel.processes import service_process  # noqa: E402 (after the path set-up)

RESULTS = REPO / "lab" / "bench" / "results"
CONCURRENCY = (1, 16, 64)
LINE = "customer_service"
API_KEY = "fw-bench-key"
PROMPT = "Name three colours."
# Every path serves the line's champion adapter (as flywheel does: one LoRA per line), so
# the shadow adds LoRA requests to a LoRA workload, not LoRA kernels to a base-only one.
CHAMPION_ADAPTER = f"{LINE}-v1"
SHADOW_ADAPTER = f"{LINE}-v2"
LIMITED = "flywheel+limits+shadow"

# What _route does, run by an older commit's code on its own store (its schema may be older).
ROUTE_SCRIPT = """
import sys
from pathlib import Path
from feedback.store import FeedbackStore
from flywheel.settings import Settings
from registry.routes import RouteStore

home, line, champion, shadow_adapter = Path(sys.argv[1]), *sys.argv[2:5]
shadow = float(sys.argv[5])
store = FeedbackStore.open(Settings(home=home, database_url=None))
routes = RouteStore(store.engine)
routes.change(line, lambda t: t.with_champion(champion), action="champion_set", actor="bench")
if shadow:
    routes.change(line, lambda t: t.with_shadow(shadow_adapter, shadow), action="shadow_set",
                  actor="bench")
store.close()
"""


@dataclass
class Sample:
    """One request: latency to the last byte, time to the first, success."""

    latency_s: float
    ttft_s: float
    ok: bool


@dataclass
class Cell:
    """All samples of one path at one concurrency, over every round."""

    samples: list[Sample] = field(default_factory=list)
    seconds: float = 0.0
    round_p50s: list[float] = field(default_factory=list)

    def ok(self) -> list[Sample]:
        return [s for s in self.samples if s.ok]

    def quantile(self, q: float, attribute: str = "latency_s") -> float:
        values = sorted(getattr(s, attribute) for s in self.ok())
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(q * len(values)))]

    def throughput(self) -> float:
        return len(self.ok()) / self.seconds if self.seconds else 0.0

    def errors(self) -> int:
        return len(self.samples) - len(self.ok())


async def _stream_once(session: Any, url: str, body: bytes, headers: dict[str, str]) -> Sample:
    import aiohttp

    started = time.perf_counter()
    ttft = None
    try:
        async with session.post(url, data=body, headers=headers) as response:
            if response.status != 200:
                await response.read()
                return Sample(time.perf_counter() - started, 0.0, False)
            tail = b""
            async for chunk in response.content.iter_any():
                if ttft is None:
                    ttft = time.perf_counter() - started
                tail = (tail + chunk)[-64:]
            ok = b"[DONE]" in tail
    except (aiohttp.ClientError, TimeoutError):
        return Sample(time.perf_counter() - started, 0.0, False)
    return Sample(time.perf_counter() - started, ttft or 0.0, ok)


async def _load(
    url: str, model: str, headers: dict[str, str], concurrency: int, seconds: float, tokens: int
) -> tuple[list[Sample], float]:
    """``concurrency`` closed-loop streams for ``seconds``; returns samples and elapsed time."""
    import aiohttp
    import orjson

    body = orjson.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": tokens,
            "temperature": 0.0,
            "stream": True,
        }
    )
    all_headers = {"Content-Type": "application/json", **headers}
    samples: list[Sample] = []
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        deadline = time.perf_counter() + seconds

        async def stream() -> None:
            while time.perf_counter() < deadline:
                samples.append(await _stream_once(session, url, body, all_headers))

        started = time.perf_counter()
        await asyncio.gather(*(stream() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return samples, elapsed


@contextmanager
def stub_server(work: Path) -> Iterator[tuple[str, str]]:
    """The instant stand-in in its own process: (base URL, model name)."""
    from registry.vllm_server import free_port

    port = free_port()
    argv = [sys.executable, "-m", "tests.stub_vllm", "--port", str(port), "--words", "8"]
    argv += ["--adapter", CHAMPION_ADAPTER, "--adapter", SHADOW_ADAPTER]
    ready = f"http://127.0.0.1:{port}/v1/models"
    with service_process(
        argv, name="the stand-in", ready_url=ready, log_path=work / "stub.log", cwd=REPO
    ):
        yield f"http://127.0.0.1:{port}", CHAMPION_ADAPTER


@contextmanager
def vllm_server(work: Path) -> Iterator[tuple[str, str]]:
    """A real vLLM on the CPU serving the base model: (base URL, model name)."""
    from flywheel.settings import Settings
    from registry.vllm_server import VllmEnvironment, VllmServer, VllmServerSettings, free_port
    from training.base_model import ensure_base_model

    cache = REPO / ".cache"
    cache.mkdir(exist_ok=True)
    base = ensure_base_model(cache / "models", None)
    index = Settings().torch_index
    python = VllmEnvironment(REPO / ".venv-vllm", torch_index=index, report=print).ensure()
    settings = VllmServerSettings(model=base, port=free_port(), served_model_name="base")
    with VllmServer(settings, python=python, log_path=work / "vllm.log", report=print) as server:
        _load_adapters(server.base_url, base, work)
        yield server.base_url, CHAMPION_ADAPTER


def _load_adapters(url: str, base: Path, work: Path) -> None:
    """Untrained rank-8 LoRAs of the base model as the champion and the shadow (their
    answers cost what trained ones' do)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from registry.vllm_admin import VllmAdminClient

    config = LoraConfig(r=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")
    with VllmAdminClient(url) as admin:
        for adapter in (CHAMPION_ADAPTER, SHADOW_ADAPTER):
            folder = work / adapter
            model = AutoModelForCausalLM.from_pretrained(base)
            get_peft_model(model, config).save_pretrained(folder)
            admin.load_adapter(adapter, folder)


REDIS_URL = "redis://127.0.0.1:6379/0"
# High enough that nothing is refused: every request pays for the checks, none is cut.
NEVER_REACHED = {"requests_per_min": 10_000_000, "tokens_per_min": 1_000_000_000}


def redis_answers(url: str = REDIS_URL) -> bool:
    """Whether a Redis answers at ``url``."""
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except redis.exceptions.ConnectionError:
        return False


@dataclass(frozen=True)
class Gateway:
    """A running gateway: its URL and home (the store with its shadow outputs)."""

    url: str
    home: Path

    def shadowed(self) -> tuple[int, int]:
        """(shadow answers stored, requests answered) so far."""
        from sqlalchemy import func, select

        from feedback.schema import interactions_table, shadow_outputs_table
        from feedback.store import FeedbackStore
        from flywheel.settings import Settings

        store = FeedbackStore.open(Settings(home=self.home, database_url=None))
        try:
            with store.engine.connect() as connection:
                shadows = connection.execute(
                    select(func.count()).select_from(shadow_outputs_table)
                ).scalar_one()
                answered = connection.execute(
                    select(func.count()).select_from(interactions_table)
                ).scalar_one()
        finally:
            store.close()
        return int(shadows), int(answered)


def _route(home: Path, shadow: float) -> None:
    """The line's champion adapter, and its shadow on ``shadow`` of the requests."""
    from feedback.store import FeedbackStore
    from flywheel.settings import Settings
    from registry.routes import RouteStore

    store = FeedbackStore.open(Settings(home=home, database_url=None))
    try:
        routes = RouteStore(store.engine)
        routes.change(
            LINE,
            lambda table: table.with_champion(CHAMPION_ADAPTER),
            action="champion_set",
            actor="gateway-bench",
        )
        if shadow:
            routes.change(
                LINE,
                lambda table: table.with_shadow(SHADOW_ADAPTER, shadow),
                action="shadow_set",
                actor="gateway-bench",
            )
    finally:
        store.close()


@contextmanager
def gateway(
    upstream: str,
    work: Path,
    *,
    limits: bool = False,
    shadow: float = 0.0,
    code: Path | None = None,
) -> Iterator[Gateway]:
    """flywheel's gateway (``flywheel serve gateway``, one process, SQLite store) in front of
    ``upstream``; with ``limits``, rate limits on its key and line, in Redis when one
    answers; with ``shadow``, that share of the requests answered again by a shadow
    adapter; with ``code``, the gateway of that source tree (an older commit's)."""
    import uuid

    from gateway.keys import key_digest
    from registry.vllm_server import free_port

    home = Path(tempfile.mkdtemp(prefix="gw-", dir=work))
    key: dict[str, Any] = {"name": "bench", "sha256": key_digest(API_KEY), "business_lines": [LINE]}
    keys: dict[str, Any] = {"keys": [key]}
    if limits:
        key["limits"] = {**NEVER_REACHED, "concurrent_streams": 10_000}
        keys["lines"] = {LINE: NEVER_REACHED}
    (home / "gateway-keys.yaml").write_text(json.dumps(keys), encoding="utf-8")
    if code is None:
        _route(home, shadow)
    else:  # the store's schema is the older commit's: let its own code write the routes
        import subprocess

        argv = [sys.executable, "-c", ROUTE_SCRIPT, str(home), LINE, CHAMPION_ADAPTER]
        argv += [SHADOW_ADAPTER, str(shadow)]
        subprocess.run(argv, check=True, cwd=code, env={**os.environ, "PYTHONPATH": str(code)})
    port = free_port()
    env = {
        **os.environ,
        "FLYWHEEL_HOME": str(home),
        "FLYWHEEL_GATEWAY_UPSTREAMS": upstream,
        "FLYWHEEL_GATEWAY_RATE_LIMIT_NAMESPACE": f"bench-{uuid.uuid4().hex[:8]}",
    }
    env.pop("FLYWHEEL_DATABASE_URL", None)
    env.pop("FLYWHEEL_REDIS_URL", None)
    if limits and redis_answers():
        env["FLYWHEEL_REDIS_URL"] = REDIS_URL
    flywheel = [str(Path(sys.executable).parent / "flywheel")]
    if code is not None:
        env["PYTHONPATH"] = str(code)
        flywheel = [sys.executable, "-c", "from cli.main import main; main()"]
    argv = [*flywheel, "serve", "gateway", "--host", "127.0.0.1", "--port", str(port)]
    ready = f"http://127.0.0.1:{port}/healthz"
    log = work / f"gateway-{port}.log"
    with service_process(
        argv, name="the gateway", ready_url=ready, log_path=log, env=env, cwd=code or REPO
    ):
        yield Gateway(f"http://127.0.0.1:{port}", home)


@contextmanager
def litellm(upstream: str, model: str, work: Path) -> Iterator[tuple[str, dict[str, str]]]:
    """LiteLLM's proxy in front of ``upstream``: (base URL, headers)."""
    from bench.litellm_proxy import LitellmProxy, ensure_litellm

    from registry.vllm_server import free_port

    python = ensure_litellm(REPO / ".venv-litellm", report=print)
    proxy = LitellmProxy(
        python,
        upstream_base_url=upstream,
        served_model=model,
        public_name=LINE,
        port=free_port(),
        log_path=work / "litellm.log",
    )
    with proxy:
        proxy.warm_up()
        yield proxy.base_url, proxy.headers


def measure(
    targets: dict[str, tuple[str, str, dict[str, str]]],
    seconds: float,
    rounds: int,
    tokens: int,
    streams: tuple[int, ...] = CONCURRENCY,
) -> dict[int, dict[str, Cell]]:
    """Interleaved rounds: for each concurrency, each round visits every path in turn."""
    from flywheel.progress import progress_bar

    cells = {c: {name: Cell() for name in targets} for c in streams}
    total = len(streams) * rounds * len(targets)
    with progress_bar("measuring", total=total) as advance:
        for concurrency in streams:
            for round_index in range(rounds):
                order = list(targets) if round_index % 2 == 0 else list(reversed(targets))
                for name in order:
                    url, model, headers = targets[name]
                    # A short warm-up so connection set-up is not measured.
                    asyncio.run(_load(url, model, headers, concurrency, 1.0, tokens))
                    samples, elapsed = asyncio.run(
                        _load(url, model, headers, concurrency, seconds, tokens)
                    )
                    cell = cells[concurrency][name]
                    cell.samples += samples
                    cell.seconds += elapsed
                    cell.round_p50s.append(Cell(samples).quantile(0.5))
                    advance(1)
    return cells


def against_baseline(cells: dict[int, dict[str, Cell]], baseline: str) -> list[dict[str, Any]]:
    """Each path against its ``@baseline`` twin, round by round (the rounds interleave, so
    a round's two p50s met the same machine): the median and range of the per-round
    differences, which say whether a change is larger than the rounds' own spread."""
    rows = []
    for concurrency, by_path in cells.items():
        for name, cell in by_path.items():
            old = by_path.get(f"{name}@{baseline}")
            if old is None:
                continue
            steps = [
                (new - was) * 1000 for new, was in zip(cell.round_p50s, old.round_p50s, strict=True)
            ]
            rows.append(
                {
                    "streams": concurrency,
                    "path": name,
                    "p50_change_ms": statistics.median(steps),
                    "p50_change_low_ms": min(steps),
                    "p50_change_high_ms": max(steps),
                    "rounds": len(steps),
                    "p50_change_share": statistics.median(steps) / 1000 / old.quantile(0.5),
                }
            )
            print(
                f"{name} against {baseline} at {concurrency} streams: p50 "
                f"{statistics.median(steps):+.2f} ms a round (median of {len(steps)}; "
                f"rounds {min(steps):+.2f} to {max(steps):+.2f} ms)"
            )
    return rows


def report(server: str, cells: dict[int, dict[str, Cell]]) -> list[dict[str, Any]]:
    """Print a table per server and return its rows."""
    from rich.console import Console
    from rich.table import Table

    rows = []
    table = Table(title=f"{server}: streamed chat completions, added over direct")
    for column in (
        "streams", "path", "requests", "errors", "p50 ms", "p99 ms", "TTFT p50 ms",
        "req/s", "added p50 ms", "added p99 ms", "throughput vs direct",
    ):  # fmt: skip
        table.add_column(column, justify="right")
    for concurrency, by_path in cells.items():
        direct = by_path["direct"]
        for name, cell in by_path.items():
            added50 = (cell.quantile(0.5) - direct.quantile(0.5)) * 1000
            added99 = (cell.quantile(0.99) - direct.quantile(0.99)) * 1000
            ratio = cell.throughput() / direct.throughput() if direct.throughput() else 0.0
            row = {
                "server": server,
                "streams": concurrency,
                "path": name,
                "requests": len(cell.samples),
                "errors": cell.errors(),
                "p50_ms": cell.quantile(0.5) * 1000,
                "p99_ms": cell.quantile(0.99) * 1000,
                "ttft_p50_ms": cell.quantile(0.5, "ttft_s") * 1000,
                "rps": cell.throughput(),
                "added_p50_ms": added50,
                "added_p99_ms": added99,
                "throughput_ratio": ratio,
            }
            rows.append(row)
            table.add_row(
                str(concurrency),
                name,
                str(row["requests"]),
                str(row["errors"]),
                f"{row['p50_ms']:.2f}",
                f"{row['p99_ms']:.2f}",
                f"{row['ttft_p50_ms']:.2f}",
                f"{row['rps']:.1f}",
                "-" if name == "direct" else f"{added50:+.2f}",
                "-" if name == "direct" else f"{added99:+.2f}",
                "-" if name == "direct" else f"{ratio:.3f}",
            )
    Console(width=180).print(table)
    return rows


def split_check(users: int = 100_000) -> dict[str, Any]:
    """The sticky split over ``users`` distinct users on a 5% canary."""
    from registry.routing import RoutingTable, choose_arm

    table = RoutingTable(business_line=LINE, champion=f"{LINE}-v1", canary=f"{LINE}-v2")
    arms = [choose_arm(table, f"user-{i}")[0] for i in range(users)]
    repeat = all(choose_arm(table, f"user-{i}")[0] == arms[i] for i in range(0, users, 7))
    share = arms.count("canary") / users
    print(f"split: {share:.4%} of {users:,} users on the 5% canary; repeat requests same arm: "
          f"{repeat}")  # fmt: skip
    return {"users": users, "canary_share": share, "sticky": repeat}


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Added p50/p99 latency per path and concurrency, one panel per server."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    servers = sorted({r["server"] for r in rows})
    figure, axes = plt.subplots(1, len(servers), figsize=(6 * len(servers), 4), squeeze=False)
    for axis, server in zip(axes[0], servers, strict=True):
        proxies = sorted({r["path"] for r in rows if r["server"] == server} - {"direct"})
        width = 0.8 / (2 * len(proxies))
        for index, proxy in enumerate(proxies):
            mine = [r for r in rows if r["server"] == server and r["path"] == proxy]
            xs = range(len(mine))
            for offset, (key, hatch) in enumerate((("added_p50_ms", ""), ("added_p99_ms", "//"))):
                position = [x + (2 * index + offset) * width for x in xs]
                axis.bar(position, [r[key] for r in mine], width, hatch=hatch,
                         label=f"{proxy} {key.split('_')[1]}")  # fmt: skip
        streams = sorted({r["streams"] for r in rows if r["server"] == server})
        axis.set_xticks([x + 0.4 - width / 2 for x in range(len(streams))])
        axis.set_xticklabels([f"{c} streams" for c in streams])
        axis.set_ylabel("added latency over direct (ms)")
        axis.set_title(server)
        axis.axhline(0, color="black", linewidth=0.5)
        axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def _streams(text: str) -> tuple[int, ...]:
    try:
        streams = tuple(int(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of stream counts: {text!r}") from None
    if not streams or min(streams) < 1:
        raise argparse.ArgumentTypeError(f"stream counts must be at least 1: {text!r}")
    return streams


def baseline_tree(rev: str, work: Path) -> Path:
    """The source tree of commit ``rev``, unpacked under ``work`` (``git archive``)."""
    import subprocess

    tree = work / "baseline"
    tree.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--seconds", type=float, default=15.0, help="Per path, round and concurrency."
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=8, help="max_tokens per answer.")
    parser.add_argument("--no-litellm", action="store_true", help="Skip LiteLLM's proxy.")
    parser.add_argument("--no-vllm", action="store_true", help="Only the instant stand-in.")
    parser.add_argument("--no-stand-in", action="store_true", help="Only the real vLLM.")
    parser.add_argument(
        "--shadow", type=float, default=0.1, help="Share of requests the shadow answers again."
    )
    parser.add_argument(
        "--streams",
        type=_streams,
        default=CONCURRENCY,
        help="Concurrent streams to measure, comma-separated (default 1,16,64).",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="Also measure the gateway of this commit (both paths) in the same rounds.",
    )
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "split": split_check(),
        "rows": [],
        "limits_in": "redis" if redis_answers() else "process",
    }
    results["shadow_share"] = args.shadow
    print(f"{LIMITED}: limits counted in {results['limits_in']}, shadow on {args.shadow:.0%}")
    servers = [] if args.no_stand_in else [("stand-in", stub_server)]
    servers += [] if args.no_vllm else [("vLLM CPU", vllm_server)]
    gateway_headers = {"Authorization": f"Bearer {API_KEY}", "x-user-id": "bench-user"}
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as scratch, ExitStack() as stack:
        work = Path(scratch)
        old = baseline_tree(args.baseline, work) if args.baseline else None
        if old is not None:
            results["baseline"] = args.baseline
        for server_name, start in servers:
            with (
                start(work) as (upstream, model),
                gateway(upstream, work) as plain,
                gateway(upstream, work, limits=True, shadow=args.shadow) as limited,
            ):
                targets = {
                    "direct": (f"{upstream}/v1/chat/completions", model, {}),
                    "flywheel": (f"{plain.url}/v1/chat/completions", LINE, gateway_headers),
                    LIMITED: (f"{limited.url}/v1/chat/completions", LINE, gateway_headers),
                }
                if old is not None:
                    for name, options in (("flywheel", {}), (LIMITED, {"limits": True})):
                        was = stack.enter_context(
                            gateway(upstream, work, shadow=args.shadow if options else 0.0,
                                    code=old, **options)
                        )  # fmt: skip
                        url = f"{was.url}/v1/chat/completions"
                        targets[f"{name}@{args.baseline}"] = (url, LINE, gateway_headers)
                if args.no_litellm:
                    cells = measure(targets, args.seconds, args.rounds, args.tokens, args.streams)
                else:
                    with litellm(upstream, model, work) as (litellm_url, litellm_headers):
                        targets["litellm"] = (
                            f"{litellm_url}/v1/chat/completions", LINE, litellm_headers,
                        )  # fmt: skip
                        cells = measure(
                            targets, args.seconds, args.rounds, args.tokens, args.streams
                        )
                stack.close()
                results["rows"] += report(server_name, cells)
                if old is not None:
                    results.setdefault("against_baseline", {})[server_name] = against_baseline(
                        cells, args.baseline
                    )
                shadows, answered = limited.shadowed()
                results.setdefault("shadowed", {})[server_name] = [shadows, answered]
                print(f"{LIMITED} on {server_name}: {shadows:,} shadow answers stored for "
                      f"{answered:,} requests ({shadows / max(answered, 1):.1%})")  # fmt: skip
    (RESULTS / "gateway_bench.json").write_text(json.dumps(results, indent=2), encoding="utf-8")
    plot(results["rows"], RESULTS / "gateway_overhead.png")
    compared = [r["path"] for r in results["rows"] if r["server"] == "stand-in"]
    for path in dict.fromkeys(p for p in compared if p.startswith("flywheel")):
        mine = [r for r in results["rows"] if r["path"] == path and r["server"] == "stand-in"]
        if mine:
            print(
                f"{path} on the stand-in: added p50 "
                + ", ".join(f"{r['added_p50_ms']:+.2f} ms @{r['streams']}" for r in mine)
                + f"; median {statistics.median(r['added_p50_ms'] for r in mine):+.2f} ms"
            )
    print(f"results: {RESULTS / 'gateway_bench.json'}, plot: {RESULTS / 'gateway_overhead.png'}")


if __name__ == "__main__":
    main()
