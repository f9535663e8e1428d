"""Throughput and scaling of feedback dedup, and exact dedup on real HH-RLHF prompts.

Run: ``.venv/bin/python lab/bench/dedup_bench.py [--json results.json]``

It generates feedback-like records (English and Chinese, short and long,
template floods with changing order numbers and names, re-sent messages with
other case, spacing, punctuation or width, edited long messages, several
business lines, signals and preference pairs; Faker seeded), deduplicates
100,000 and then 1,000,000 of them, and prints records per second, the time
ratio for 10x the data (linear cost gives about 10) and how well the clusters
match the generator's own groups. Then it deduplicates the first human prompt
of every row of ``../shared/data/hh-rlhf/harmless-base-test.jsonl.gz`` and
reports the repeated prompts (skipped with a reason when the data is absent).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import resource
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from rich.console import Console
    from rich.progress import Progress

    from feedback.dedup import DedupDecision
    from flywheel.settings.cleaning import DedupSettings

REPO_ROOT = Path(__file__).resolve().parents[2]
HH_RLHF = REPO_ROOT.parent / "shared" / "data" / "hh-rlhf" / "harmless-base-test.jsonl.gz"
BUSINESS_LINES = ("retail", "banking", "travel", "telecom", "insurance")
SIGNALS = ("thumbs_up", "thumbs_down", "regenerate", "edit")
SIGNAL_WEIGHTS = (0.55, 0.3, 0.1, 0.05)
EN_TEMPLATES = (
    "I want to cancel my order {num}",
    "Where is my package? Tracking number {code}",
    "Hi, this is {name}. I can't log into my account, error code {num}.",
    "Hello, my name is {name} and I would like a refund for order {num} placed on {date}.",
    "Please reset the password for account {num}, it is locked again",
    "My card ending in {num} was charged twice on {date}, please fix it",
    "Flight {code} from {city} was cancelled, I need to rebook for {date}",
    "Why is my bill for number {num} so high this month?",
    "I need a copy of my policy {code} sent to {email}",
    "Can you tell me the status of claim {num}? My name is {name}.",
)
ZH_TEMPLATES = (
    "我想取消订单{num}",
    "你好，我是{name}，我的订单{num}一直没有发货，请帮我查一下物流",
    "请问航班{code}从{city}出发的时间改了吗？",
    "我的银行卡尾号{num}在{date}被扣了两次钱，请处理",
    "帮我查一下保单{num}的理赔进度，我叫{name}",
    "手机号{num}的话费为什么这么高？",
)
EN_FRAMES = ("", "", "how do i ", "why does the ", "can you explain ", "please help with ")
ZH_FRAMES = ("", "", "请问", "为什么", "怎么", "帮我看看")


@dataclass
class GeneratedBatch:
    """Records and, for each, the generator's group: records of one group are duplicates."""

    records: list[dict[str, Any]]
    groups: np.ndarray


class FeedbackGenerator:
    """Feedback-like records from Faker vocabularies, reproducible for a seed."""

    def __init__(self, seed: int) -> None:
        import numpy as np
        from faker import Faker

        self.rng = np.random.default_rng(seed)
        english = Faker("en_US")
        english.seed_instance(seed)
        chinese = Faker("zh_CN")
        chinese.seed_instance(seed)
        words: set[str] = set(english.words(nb=5000, unique=False))
        for _ in range(1500):
            for phrase in (english.catch_phrase(), english.bs(), english.job()):
                words.update(phrase.lower().replace(",", " ").split())
        self.en_words = np.array(sorted(words))
        self.zh_words = np.array(
            sorted(
                set(chinese.words(nb=5000, unique=False))
                | {chinese.city() for _ in range(300)}
                | {chinese.name() for _ in range(300)}
            )
        )
        self.en_names = [english.name() for _ in range(2000)]
        self.zh_names = [chinese.name() for _ in range(2000)]
        self.cities = [english.city() for _ in range(500)] + [chinese.city() for _ in range(500)]
        self.emails = [english.email() for _ in range(1000)]

    def batch(self, count: int, progress: Progress | None = None) -> GeneratedBatch:
        """``count`` records in input order, with ground-truth groups."""
        import numpy as np

        rng = self.rng
        kinds = rng.choice(
            np.array(["en_short", "en_long", "zh_short", "zh_long", "flood", "resent", "edited"]),
            size=count,
            p=[0.33, 0.1, 0.15, 0.05, 0.22, 0.1, 0.05],
        )
        flood_count = 60
        flood_weights = 1.0 / np.arange(1, flood_count + 1)
        flood_of = rng.choice(flood_count, size=count, p=flood_weights / flood_weights.sum())
        flood_line = rng.choice(len(BUSINESS_LINES), size=flood_count)
        lines = rng.choice(len(BUSINESS_LINES), size=count)
        no_line = rng.random(count) < 0.03
        signals = rng.choice(len(SIGNALS), size=count, p=SIGNAL_WEIGHTS)
        base = np.datetime64("2025-01-01T00:00:00", "ms")
        jitter = rng.normal(0, 30_000, size=count).astype("int64")
        moments = base + (np.arange(count, dtype="int64") * 500 + jitter).astype("timedelta64[ms]")
        created = np.datetime_as_string(moments, unit="ms", timezone="UTC")
        pair_start = rng.random(count) < 0.05

        records: list[dict[str, Any]] = []
        groups = np.empty(count, dtype=np.int64)
        task = progress.add_task(f"generating {count:,}", total=count) if progress else None
        index = 0
        while index < count:
            kind = str(kinds[index])
            group = index
            if kind == "flood":
                flood = int(flood_of[index])
                text = self._flood_text(flood)
                # Floods sharing a template are one group: they are the same flood.
                group = -1 - flood % (len(EN_TEMPLATES) + len(ZH_TEMPLATES))
                line_index = int(flood_line[flood])
            elif kind in {"resent", "edited"} and index > 0:
                source = int(rng.integers(max(0, index - 50_000), index))
                group = int(groups[source])
                text = records[source]["text"]
                text = self._resend(text) if kind == "resent" else self._edit(text)
                line_index = int(lines[index])
            else:
                text = self._message(kind)
                line_index = int(lines[index])
            record: dict[str, Any] = {
                "id": index,
                "text": text,
                "signal": SIGNALS[int(signals[index])],
                "created_at": str(created[index]),
            }
            if not no_line[index]:
                record["business_line"] = BUSINESS_LINES[line_index]
            records.append(record)
            groups[index] = group
            # A preference pair: this answer and a slightly different one.
            if pair_start[index] and index + 1 < count and kind != "flood":
                record.update(pair_id=f"pair-{index}", role="chosen")
                del record["signal"]
                twin = dict(record, id=index + 1, role="rejected", text=self._edit(text))
                records.append(twin)
                groups[index + 1] = group
                index += 1
            index += 1
            if task is not None and progress is not None and index % 20_000 < 2:
                progress.update(task, completed=index)
        if task is not None and progress is not None:
            progress.update(task, completed=count)
        return GeneratedBatch(records=records, groups=groups)

    def _message(self, kind: str) -> str:
        rng = self.rng
        if kind.startswith("en"):
            length = int(rng.integers(3, 13)) if kind == "en_short" else int(rng.integers(40, 160))
            words = " ".join(rng.choice(self.en_words, size=length).tolist())
            frame = EN_FRAMES[int(rng.integers(len(EN_FRAMES)))]
            text = (frame + words).capitalize()
            return text + ("?" if frame else ".")
        length = int(rng.integers(3, 11)) if kind == "zh_short" else int(rng.integers(30, 100))
        frame = ZH_FRAMES[int(rng.integers(len(ZH_FRAMES)))]
        return frame + "".join(rng.choice(self.zh_words, size=length).tolist()) + "。"

    def _flood_text(self, flood: int) -> str:
        rng = self.rng
        templates = EN_TEMPLATES + ZH_TEMPLATES
        template = templates[flood % len(templates)]
        chinese = flood % len(templates) >= len(EN_TEMPLATES)
        names = self.zh_names if chinese else self.en_names
        return template.format(
            num=int(rng.integers(1000, 10_000_000)),
            code=f"{chr(65 + int(rng.integers(26)))}{int(rng.integers(100, 99999))}",
            name=names[int(rng.integers(len(names)))],
            city=self.cities[int(rng.integers(len(self.cities)))],
            date=f"2025-{int(rng.integers(1, 13)):02d}-{int(rng.integers(1, 29)):02d}",
            email=self.emails[int(rng.integers(len(self.emails)))],
        )

    def _resend(self, text: str) -> str:
        variant = int(self.rng.integers(4))
        if variant == 0:
            return text.upper()
        if variant == 1:
            return "  " + text.replace(" ", "   ") + " "
        if variant == 2:
            return text.rstrip(".?!。？") + "!!"
        # Full-width forms of ASCII letters and digits.
        return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else c for c in text)

    def _edit(self, text: str) -> str:
        words = text.split()
        if len(words) < 20:
            return text + " " + str(self.rng.choice(self.en_words))
        position = int(self.rng.integers(len(words)))
        words[position] = str(self.rng.choice(self.en_words))
        return " ".join(words)


@dataclass
class RunResult:
    """One timed dedup run."""

    records: int
    seconds: float
    records_per_second: float
    kept: int
    clusters: int
    expected_kept: int
    merges_across_groups: int
    duplicates_left: int
    peak_rss_mib: float


def timed_dedup(
    records: Sequence[dict[str, Any]], settings: DedupSettings, progress: Progress
) -> tuple[list[DedupDecision], float]:
    """Sign every record (with a progress bar) and cluster them; return decisions and seconds."""
    from feedback.dedup import DedupBatch

    task = progress.add_task(f"dedup {len(records):,}", total=len(records) + 1)
    start = time.perf_counter()
    batch = DedupBatch(field="text", settings=settings)
    for index, record in enumerate(records):
        batch.add(record)
        if index % 10_000 == 0:
            progress.update(task, completed=index)
    progress.update(task, completed=len(records), description=f"clustering {len(records):,}")
    decisions = batch.decide()
    seconds = time.perf_counter() - start
    progress.update(task, completed=len(records) + 1)
    return decisions, seconds


def score(
    generated: GeneratedBatch, decisions: Sequence[DedupDecision], seconds: float
) -> RunResult:
    """Compare the clusters with the generator's groups."""
    records, groups = generated.records, generated.groups

    def scope(record: dict[str, Any]) -> tuple[Any, ...]:
        return (
            record.get("business_line", "default"),
            record.get("signal"),
            record.get("role"),
        )

    expected = {(int(groups[i]), scope(r)) for i, r in enumerate(records)}
    kept_groups = Counter(
        (int(groups[i]), scope(records[i])) for i, d in enumerate(decisions) if d.keep
    )
    merges_across = sum(
        1
        for i, d in enumerate(decisions)
        if not d.keep and int(groups[i]) != int(groups[d.cluster])
    )
    kept = sum(kept_groups.values())
    return RunResult(
        records=len(records),
        seconds=round(seconds, 3),
        records_per_second=round(len(records) / seconds, 1),
        kept=kept,
        clusters=len({d.cluster for d in decisions}),
        expected_kept=len(expected),
        merges_across_groups=merges_across,
        duplicates_left=kept - len(kept_groups),
        peak_rss_mib=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    )


def first_human_prompt(conversation: str) -> str:
    """The first ``Human:`` turn of an HH-RLHF transcript."""
    after = conversation.split("\n\nHuman: ", 1)[-1]
    return after.split("\n\nAssistant:", 1)[0].strip()


def hh_rlhf_repeats(settings: DedupSettings, console: Console) -> dict[str, Any]:
    """Repeated first prompts of HH-RLHF harmless-base test, raw and after dedup."""
    from feedback.dedup import assign_clusters

    if not HH_RLHF.exists():
        reason = f"skipped: {HH_RLHF} is absent (shared data is not part of a fresh clone)"
        console.print(f"[yellow]HH-RLHF {reason}[/yellow]")
        return {"skipped": reason}
    with gzip.open(HH_RLHF, "rt", encoding="utf-8") as stream:
        rows = [json.loads(line) for line in stream if line.strip()]
    prompts = [first_human_prompt(row["chosen"]) for row in rows]
    records = [{"first_prompt": prompt} for prompt in prompts]

    raw = Counter(prompts)
    result: dict[str, Any] = {
        "rows": len(rows),
        "raw_string": {
            "repeated_prompts": sum(1 for n in raw.values() if n > 1),
            "rows_involved": sum(n for n in raw.values() if n > 1),
        },
    }
    for name, run_settings in (
        ("exact_dedup", settings.model_copy(update={"near_duplicates": False})),
        ("near_dedup", settings),
    ):
        start = time.perf_counter()
        decisions = assign_clusters(records, field="first_prompt", settings=run_settings)
        seconds = time.perf_counter() - start
        sizes = Counter(d.cluster for d in decisions)
        result[name] = {
            "repeated_prompts": sum(1 for n in sizes.values() if n > 1),
            "rows_involved": sum(n for n in sizes.values() if n > 1),
            "rows_dropped": sum(1 for d in decisions if not d.keep),
            "seconds": round(seconds, 3),
        }
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """Generate, deduplicate, time and report."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write the results to this JSON file")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[100_000, 1_000_000], help="record counts to run"
    )
    parser.add_argument("--seed", type=int, default=20250101)
    args = parser.parse_args(argv)

    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.table import Table

    from feedback.dedup import sign_text
    from flywheel.settings.cleaning import DedupSettings

    console = Console()
    settings = DedupSettings()
    console.print(
        f"[bold]dedup bench[/bold]: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
        f"num_perm={settings.num_perm}, bands={settings.bands}x{settings.rows}, "
        f"threshold={settings.threshold}, shingles={settings.shingle_sizes}"
    )
    # One-time costs (lookup tables, numpy start-up) stay out of the timed runs.
    sign_text("warm up 123 你好", settings)
    runs: list[RunResult] = []
    generation_seconds: list[float] = []
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
    ) as progress:
        for size in args.sizes:
            start = time.perf_counter()
            generated = FeedbackGenerator(args.seed).batch(size, progress)
            generation_seconds.append(round(time.perf_counter() - start, 2))
            decisions, seconds = timed_dedup(generated.records, settings, progress)
            runs.append(score(generated, decisions, seconds))
            del generated, decisions

    table = Table(title="dedup of generated records (signing + clustering, records in memory)")
    for column in ("records", "seconds", "records/s", "kept", "expected", "cross", "left", "MiB"):
        table.add_column(column, justify="right")
    for run in runs:
        table.add_row(
            f"{run.records:,}",
            f"{run.seconds:.2f}",
            f"{run.records_per_second:,.0f}",
            f"{run.kept:,}",
            f"{run.expected_kept:,}",
            f"{run.merges_across_groups:,}",
            f"{run.duplicates_left:,}",
            f"{run.peak_rss_mib:,.0f}",
        )
    console.print(table)
    ratio = None
    if len(runs) >= 2:
        ratio = runs[-1].seconds / runs[0].seconds
        growth = runs[-1].records / runs[0].records
        console.print(
            f"time for {growth:g}x the records: [bold]{ratio:.2f}x[/bold] "
            f"(linear cost gives {growth:g})"
        )
    console.print(
        "expected: distinct generator groups per scope (what a perfect dedup keeps); "
        "cross: dropped records whose cluster's first record is from another group (includes "
        "chance collisions of short random messages); left: kept records whose group already "
        "had a kept record in their scope (missed duplicates); MiB: peak resident memory"
    )
    hh = hh_rlhf_repeats(settings, console)
    if "skipped" not in hh:
        hh_table = Table(
            title=f"HH-RLHF harmless-base test: first human prompt of {hh['rows']:,} rows"
        )
        for column in ("method", "repeated prompts", "rows involved", "rows dropped"):
            hh_table.add_column(column, justify="right")
        hh_table.add_row(
            "raw string equality",
            str(hh["raw_string"]["repeated_prompts"]),
            str(hh["raw_string"]["rows_involved"]),
            "",
        )
        for name in ("exact_dedup", "near_dedup"):
            hh_table.add_row(
                name.replace("_", " "),
                str(hh[name]["repeated_prompts"]),
                str(hh[name]["rows_involved"]),
                str(hh[name]["rows_dropped"]),
            )
        console.print(hh_table)

    if args.json:
        results = {
            "settings": settings.model_dump(mode="json"),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "generation_seconds": generation_seconds,
            "runs": [asdict(run) for run in runs],
            "time_ratio": None if ratio is None else round(ratio, 3),
            "hh_rlhf": hh,
        }
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        console.print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
