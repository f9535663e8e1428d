"""Benchmark the PII scrubber against vanilla Presidio on halves it was and was not tuned on.

Run from the repository root::

    .venv/bin/python lab/bench/pii_bench.py [--json results.json] [--synth-n N] [--wnut-n N]

Data comes from ``<repo>/../shared/data`` (presidio-research synth_dataset_v2,
weibo-ner dev and train pooled, wnut17 dev), and Chinese customer-service sentences are
generated from written templates and Faker's zh_CN values (``zh_synth``); the run stops
with a clear message when the shared data is absent. Every data set is cut in two halves
by :func:`half_of` (the SHA-256 of a document's text, so a document keeps its half
whatever the file's order): the rules may be tuned on the ``tune`` half only; the
``heldout`` half is for measuring. Each figure is printed for both halves, ours and
vanilla Presidio (default recognizers, the same spaCy model) side by side, with the
difference and ratio, then the goals checked on the held-out halves. Definitions:

* leak: share of gold values that still appear verbatim in the output;
* high-risk leak: leak over e-mail addresses, phone numbers, cards, US SSNs, IBANs,
  IP addresses and Chinese resident IDs (synth, zh_synth);
* recall: share of the gold entities' non-space characters that were replaced
  (any placeholder counts: a name replaced as an address is still gone);
* full: share of gold entities replaced entirely; hit: share with any character replaced;
* non-PII kept: share of the word tokens (whitespace-separated, holding a letter or
  digit; each Han character on its own) outside the gold spans of the PII types that
  come out with no character replaced. On wnut17 every token outside a gold person
  counts as non-PII, on weibo every character outside a PER.NAM name (PER.NOM such as
  老师 is not PII and not scored);
* over-replacement: share of non-space characters outside every gold span replaced;
* chars/s: input characters per second of wall time on the same synth records, one
  process, models loaded beforehand, no caching across records.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / ".." / "shared" / "data"
SYNTH = DATA / "presidio-research" / "synth_dataset_v2.json"
WEIBO = DATA / "weibo-ner" / "weiboNER_2nd_conll.{split}"
WNUT = DATA / "wnut17" / "emerging.dev.conll"

TARGET_TYPES = (
    "PERSON",
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "US_SSN",
    "IBAN_CODE",
    "IP_ADDRESS",
    "STREET_ADDRESS",
)
HIGH_RISK_TYPES = (
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "US_SSN",
    "IBAN_CODE",
    "IP_ADDRESS",
    "CN_RESIDENT_ID",
)
Half = Literal["tune", "heldout"]
HALVES: tuple[Half, ...] = ("tune", "heldout")
console = Console(stderr=True)
_WORD_TOKEN = re.compile(r"[\u3400-\u9fff]|[^\s\u3400-\u9fff]+")
_HAS_ALNUM = re.compile(r"[^\W_]")


@dataclass(frozen=True)
class GoldSpan:
    """One annotated entity: type, offsets (end exclusive) and its text."""

    entity_type: str
    start: int
    end: int
    value: str


@dataclass(frozen=True)
class Example:
    """A text with its gold entities."""

    text: str
    gold: tuple[GoldSpan, ...]


@dataclass
class Scored:
    """What a system did to one text: which characters it replaced, and the output."""

    replaced: list[bool]
    output: str


@dataclass
class TypeScore:
    """Recall, full-entity recall and leaks for one entity type."""

    spans: int = 0
    chars: int = 0
    covered: int = 0
    full: int = 0
    hit: int = 0
    leaked: int = 0

    @property
    def recall(self) -> float:
        """Share of gold characters replaced."""
        return self.covered / self.chars if self.chars else 0.0

    def as_dict(self) -> dict[str, float | int]:
        """The scores, rounded, for the table and the JSON file."""
        return {
            "spans": self.spans,
            "recall": round(self.recall, 4),
            "full": round(self.full / self.spans, 4) if self.spans else 0.0,
            "hit": round(self.hit / self.spans, 4) if self.spans else 0.0,
            "leak": round(self.leaked / self.spans, 4) if self.spans else 0.0,
        }


@dataclass
class Evaluation:
    """Scores of one system on one data set."""

    by_type: dict[str, TypeScore] = field(default_factory=dict)
    outside_chars: int = 0
    outside_replaced: int = 0

    def overall(self, types: Iterable[str]) -> TypeScore:
        """The scores of several types pooled together."""
        total = TypeScore()
        for name in types:
            score = self.by_type.get(name)
            if score is None:
                continue
            total.spans += score.spans
            total.chars += score.chars
            total.covered += score.covered
            total.full += score.full
            total.hit += score.hit
            total.leaked += score.leaked
        return total

    @property
    def over_replacement(self) -> float:
        """Share of non-gold characters replaced."""
        return self.outside_replaced / self.outside_chars if self.outside_chars else 0.0


def evaluate(examples: Sequence[Example], scored: Sequence[Scored]) -> Evaluation:
    """Score replaced-character masks and outputs against gold spans."""
    evaluation = Evaluation()
    for example, result in zip(examples, scored, strict=True):
        inside = [False] * len(example.text)
        for span in example.gold:
            score = evaluation.by_type.setdefault(span.entity_type, TypeScore())
            positions = [i for i in range(span.start, span.end) if not example.text[i].isspace()]
            covered = sum(result.replaced[i] for i in positions)
            score.spans += 1
            score.chars += len(positions)
            score.covered += covered
            score.full += covered == len(positions)
            score.hit += covered > 0
            score.leaked += bool(span.value.strip()) and span.value.strip() in result.output
            for i in range(span.start, span.end):
                inside[i] = True
        for i, ch in enumerate(example.text):
            if not inside[i] and not ch.isspace():
                evaluation.outside_chars += 1
                evaluation.outside_replaced += result.replaced[i]
    return evaluation


def tokens_kept(
    examples: Sequence[Example], scored: Sequence[Scored], pii_types: Iterable[str] | None = None
) -> float:
    """Share of word tokens outside the gold spans of ``pii_types`` (all types when ``None``)
    that no replacement touched."""
    wanted = None if pii_types is None else set(pii_types)
    total = kept = 0
    for example, result in zip(examples, scored, strict=True):
        inside = [False] * len(example.text)
        for span in example.gold:
            if wanted is None or span.entity_type in wanted:
                inside[span.start : span.end] = [True] * (span.end - span.start)
        for match in _WORD_TOKEN.finditer(example.text):
            start, end = match.span()
            if not _HAS_ALNUM.search(match.group()) or any(inside[start:end]):
                continue
            total += 1
            kept += not any(result.replaced[start:end])
    return kept / total if total else 1.0


def load_synth(limit: int | None) -> list[Example]:
    """presidio-research synth_dataset_v2: full_text plus end-exclusive spans."""
    rows = json.loads(SYNTH.read_text(encoding="utf-8"))
    examples = [
        Example(
            row["full_text"],
            tuple(
                GoldSpan(
                    s["entity_type"], s["start_position"], s["end_position"], s["entity_value"]
                )
                for s in row["spans"]
            ),
        )
        for row in rows
    ]
    return examples[:limit] if limit else examples


def _bio_examples(
    lines: Iterable[str], split_token: Callable[[str], tuple[str, str]], joiner: str
) -> list[Example]:
    examples: list[Example] = []
    tokens: list[tuple[str, str]] = []

    def flush() -> None:
        if not tokens:
            return
        text_parts: list[str] = []
        gold: list[GoldSpan] = []
        position = 0
        current: list[Any] | None = None
        for token, tag in tokens:
            if text_parts:
                text_parts.append(joiner)
                position += len(joiner)
            start, end = position, position + len(token)
            text_parts.append(token)
            position = end
            kind = tag[2:] if tag != "O" else None
            if tag.startswith("B-") or (
                tag.startswith("I-") and (current is None or current[0] != kind)
            ):
                if current:
                    gold.append(GoldSpan(current[0], current[1], current[2], ""))
                current = [kind, start, end]
            elif tag.startswith("I-") and current is not None:
                current[2] = end
            else:
                if current:
                    gold.append(GoldSpan(current[0], current[1], current[2], ""))
                current = None
        if current:
            gold.append(GoldSpan(current[0], current[1], current[2], ""))
        text = "".join(text_parts)
        examples.append(
            Example(
                text,
                tuple(GoldSpan(g.entity_type, g.start, g.end, text[g.start : g.end]) for g in gold),
            )
        )
        tokens.clear()

    for raw in lines:
        line = raw.rstrip("\n")
        if not line.strip():
            flush()
            continue
        tokens.append(split_token(line))
    flush()
    return examples


def load_weibo(split: str) -> list[Example]:
    """Weibo NER: one character a line, ``<char><digit>\\t<tag>``; the digit is dropped."""

    def split_token(line: str) -> tuple[str, str]:
        token, tag = line.split("\t")
        return token[:-1], tag

    path = Path(str(WEIBO).format(split=split))
    return _bio_examples(path.read_text(encoding="utf-8").splitlines(), split_token, "")


def load_wnut(limit: int | None) -> list[Example]:
    """WNUT17 emerging entities dev: CoNLL tokens, joined with spaces."""

    def split_token(line: str) -> tuple[str, str]:
        token, tag = line.split("\t")
        return token, tag

    examples = _bio_examples(WNUT.read_text(encoding="utf-8").splitlines(), split_token, " ")
    return examples[:limit] if limit else examples


ZH_TEMPLATES = (
    "您好，我是{name}，手机号{phone}，请帮我查一下订单。",
    "我的身份证号是{id}，银行卡号{card}，麻烦核实一下。",
    "请把发票发到{email}，联系人{name}，电话{phone}。",
    "{name}的银行卡{card}被扣了两次款，怎么办？",
    "客户{name}（身份证{id}）来电反映问题，请回拨{phone}。",
    "退款请打到卡号{card}，户名{name}，谢谢。",
    "我叫{name}，邮箱是{email}，有消息请通知我。",
    "联系电话：{phone}，身份证：{id}。",
    "昨天{name}打电话给我，说快递一直没到。",
    "麻烦转告{name}，明天下午三点开会。",
)
"""Customer-service sentences in Chinese, filled by Faker's zh_CN provider (see
:func:`load_zh_synth`): names, mobile numbers, resident IDs, bank cards, e-mail addresses."""


def _grouped(digits: str, rng: random.Random, sizes: tuple[int, ...]) -> str:
    """``digits`` as people write them: whole, or in groups split by spaces or hyphens."""
    if rng.random() < 0.5:
        return digits
    separator = rng.choice((" ", "-"))
    parts, position = [], 0
    for size in sizes:
        parts.append(digits[position : position + size])
        position += size
    parts.append(digits[position:])
    return separator.join(part for part in parts if part)


def load_zh_synth(n: int, seed: int = 7) -> list[Example]:
    """``n`` Chinese sentences from :data:`ZH_TEMPLATES` with Faker zh_CN values, the same
    for the same seed; gold spans where each value was put."""
    from faker import Faker

    fake = Faker("zh_CN")
    fake.seed_instance(seed)
    rng = random.Random(seed)
    slots = {
        "name": ("PERSON", fake.name),
        "phone": ("PHONE_NUMBER", lambda: _grouped(fake.phone_number(), rng, (3, 4))),
        "id": ("CN_RESIDENT_ID", fake.ssn),
        "card": ("CREDIT_CARD", lambda: _grouped(fake.credit_card_number(), rng, (4, 4, 4))),
        "email": ("EMAIL_ADDRESS", fake.email),
    }
    examples = []
    for index in range(n):
        template = ZH_TEMPLATES[index % len(ZH_TEMPLATES)]
        text, gold, position = "", [], 0
        for match in re.finditer(r"\{(\w+)\}", template):
            text += template[position : match.start()]
            entity_type, make = slots[match.group(1)]
            value = make()
            gold.append(GoldSpan(entity_type, len(text), len(text) + len(value), value))
            text += value
            position = match.end()
        text += template[position:]
        examples.append(Example(text, tuple(gold)))
    return examples


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )


def run_ours(
    scrubber: Any, texts: Sequence[str], batch_size: int, label: str
) -> tuple[list[Scored], float]:
    """Scrub ``texts`` in batches; returns the masks and the seconds spent scrubbing."""
    results: list[Scored] = []
    elapsed = 0.0
    with _progress() as progress:
        task = progress.add_task(label, total=len(texts))
        for start in range(0, len(texts), batch_size):
            batch = texts[start : start + batch_size]
            began = time.perf_counter()
            scrubbed = scrubber.scrub_texts(batch)
            elapsed += time.perf_counter() - began
            for text, result in zip(batch, scrubbed, strict=True):
                replaced = [False] * len(text)
                for span in result.spans:
                    for i in range(span.start, span.end):
                        replaced[i] = True
                results.append(Scored(replaced, result.text))
            progress.advance(task, len(batch))
    return results, elapsed


def build_vanilla(model: str) -> tuple[Any, Any]:
    """Vanilla Presidio: default recognizers, the same spaCy model, offline suffix list."""
    from presidio_analyzer import AnalyzerEngine
    from presidio_analyzer.nlp_engine import NlpEngineProvider
    from presidio_anonymizer import AnonymizerEngine

    from feedback.pii.recognizers import use_offline_suffix_list

    use_offline_suffix_list()
    provider = NlpEngineProvider(
        nlp_configuration={
            "nlp_engine_name": "spacy",
            "models": [{"lang_code": "en", "model_name": model}],
        }
    )
    analyzer = AnalyzerEngine(nlp_engine=provider.create_engine(), supported_languages=["en"])
    return analyzer, AnonymizerEngine()


def run_vanilla(
    analyzer: Any, anonymizer: Any, texts: Sequence[str], label: str = "vanilla Presidio"
) -> tuple[list[Scored], float]:
    """Analyze and anonymize each text, the way Presidio's README does it."""
    results: list[Scored] = []
    elapsed = 0.0
    with _progress() as progress:
        task = progress.add_task(label, total=len(texts))
        for text in texts:
            began = time.perf_counter()
            found = analyzer.analyze(text=text, language="en")
            output = anonymizer.anonymize(text=text, analyzer_results=found).text
            elapsed += time.perf_counter() - began
            replaced = [False] * len(text)
            for item in found:
                for i in range(item.start, item.end):
                    replaced[i] = True
            results.append(Scored(replaced, output))
            progress.advance(task)
    return results, elapsed


def half_of(text: str) -> Half:
    """The half a document belongs to: ``tune`` when the first byte of the SHA-256 of its
    UTF-8 text is even, else ``heldout``.

    The same text always falls in the same half, whatever the file's order or which
    subset was loaded, so rules tuned on one half are measured on documents they never saw.
    """
    return "tune" if hashlib.sha256(text.encode("utf-8")).digest()[0] % 2 == 0 else "heldout"


def split_halves(examples: Sequence[Example]) -> dict[Half, list[int]]:
    """The positions of ``examples`` in each half (see :func:`half_of`), in input order."""
    halves: dict[Half, list[int]] = {half: [] for half in HALVES}
    for position, example in enumerate(examples):
        halves[half_of(example.text)].append(position)
    return halves


@dataclass(frozen=True)
class DataSet:
    """A benchmark set: its documents, the gold types that are person names, and the gold
    types whose spans are PII when counting non-PII tokens kept (``None``: every type)."""

    name: str
    title: str
    examples: list[Example]
    person_type: str
    pii_types: tuple[str, ...] | None = None
    high_risk: bool = False


def measure(data: DataSet, scored: Sequence[Scored], positions: Sequence[int]) -> dict[str, Any]:
    """Every figure of one system on the documents of ``data`` at ``positions``."""
    examples = [data.examples[p] for p in positions]
    results = [scored[p] for p in positions]
    evaluation = evaluate(examples, results)
    figures: dict[str, Any] = {
        "documents": len(examples),
        "person": evaluation.by_type.get(data.person_type, TypeScore()).as_dict(),
        "non_pii_kept": round(tokens_kept(examples, results, data.pii_types), 4),
        "over_replacement": round(evaluation.over_replacement, 4),
    }
    if data.high_risk:
        figures["high_risk"] = evaluation.overall(HIGH_RISK_TYPES).as_dict()
        figures["per_type"] = {
            t: evaluation.by_type.get(t, TypeScore()).as_dict() for t in TARGET_TYPES
        }
        figures["overall"] = evaluation.overall((*TARGET_TYPES, "CN_RESIDENT_ID")).as_dict()
    return figures


@dataclass(frozen=True)
class Goal:
    """A bound on one figure of ours on a held-out half."""

    label: str
    data_set: str
    figure: tuple[str, ...]
    limit: float
    at_most: bool


GOALS = (
    Goal("English person names leaked (wnut17)", "wnut17", ("person", "leak"), 0.15, True),
    Goal("Chinese person names leaked (weibo)", "weibo", ("person", "leak"), 0.15, True),
    Goal("high-risk values leaked (synth)", "synth", ("high_risk", "leak"), 0.02, True),
    Goal("high-risk values leaked (zh_synth)", "zh_synth", ("high_risk", "leak"), 0.02, True),
    Goal("non-PII tokens kept (synth)", "synth", ("non_pii_kept",), 0.90, False),
    Goal("non-PII characters kept (zh_synth)", "zh_synth", ("non_pii_kept",), 0.90, False),
    Goal("non-PII tokens kept (wnut17)", "wnut17", ("non_pii_kept",), 0.90, False),
    Goal("non-PII characters kept (weibo)", "weibo", ("non_pii_kept",), 0.90, False),
)


def figure_of(figures: dict[str, Any], path: Sequence[str]) -> float:
    """The number at ``path`` in a :func:`measure` result."""
    value: Any = figures
    for key in path:
        value = value[key]
    return float(value)


def check_goals(sets: dict[str, Any], goals: Sequence[Goal] = GOALS) -> list[dict[str, Any]]:
    """Each goal with ours on the held-out half, vanilla's figure beside it, and whether it is
    met (pure: reads the ``sets`` part of the results)."""
    checked = []
    for goal in goals:
        if goal.data_set not in sets:
            continue
        held = sets[goal.data_set]["heldout"]
        value = figure_of(held["ours"], goal.figure)
        checked.append(
            {
                "goal": goal.label,
                "data_set": goal.data_set,
                "half": "heldout",
                "figure": ".".join(goal.figure),
                "limit": goal.limit,
                "bound": "at most" if goal.at_most else "at least",
                "ours": value,
                "vanilla": figure_of(held["vanilla"], goal.figure),
                "met": value <= goal.limit if goal.at_most else value >= goal.limit,
            }
        )
    return checked


def compare(ours: float, vanilla: float) -> dict[str, float | None]:
    """Ours against vanilla: the difference, and the ratio (``None`` when vanilla is 0)."""
    return {
        "difference": round(ours - vanilla, 4),
        "ratio": round(ours / vanilla, 3) if vanilla else None,
    }


def _load_sets(args: argparse.Namespace) -> list[DataSet]:
    weibo = load_weibo("train") + load_weibo("dev")
    return [
        DataSet(
            "synth",
            "presidio-research synth_dataset_v2 (synthetic English, 8 types)",
            load_synth(args.synth_n or None),
            "PERSON",
            high_risk=True,
        ),
        DataSet(
            "wnut17",
            "wnut17 dev (tweets, Reddit, YouTube, StackExchange): person",
            load_wnut(args.wnut_n or None),
            "person",
            ("person",),
        ),
        DataSet(
            "zh_synth",
            "Chinese customer-service sentences with Faker zh_CN values (written templates)",
            load_zh_synth(args.zh_synth_n, args.seed),
            "PERSON",
            high_risk=True,
        ),
        DataSet(
            "weibo",
            "weibo-ner train + dev (Weibo posts): PER.NAM",
            weibo[: args.weibo_n] if args.weibo_n else weibo,
            "PER.NAM",
            ("PER.NAM",),
        ),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the tables; optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synth-n", type=int, default=0, help="synth sentences (0 = all 1,500)")
    parser.add_argument("--wnut-n", type=int, default=0, help="wnut17 posts (0 = all 1,009)")
    parser.add_argument("--weibo-n", type=int, default=0, help="weibo posts (0 = all 1,620)")
    parser.add_argument(
        "--zh-synth-n", type=int, default=400, help="generated Chinese sentences (default 400)"
    )
    parser.add_argument(
        "--speed-n",
        type=int,
        default=0,
        help="synth records timed twice more, ours and vanilla back to back (0 = all loaded)",
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--json", type=Path, help="write the results here as JSON")
    args = parser.parse_args(argv)

    if not SYNTH.exists():
        console.print(
            f"skipped: benchmark data not found at {DATA.resolve()} "
            "(it needs the shared data folder next to the repository)"
        )
        return 0

    sys.path.insert(0, str(REPO))
    from feedback.pii import ScrubberSettings, build_scrubber

    settings = ScrubberSettings(batch_size=args.batch_size)
    with console.status("loading models"):
        began = time.perf_counter()
        scrubber = build_scrubber(settings)
        load_ours = time.perf_counter() - began
        analyzer, anonymizer = build_vanilla(settings.spacy_model)
        scrubber.scrub_texts(["Warm-up: John Smith, john@example.com, 张伟 13812345678."])
        analyzer.analyze(text="Warm-up: John Smith, john@example.com", language="en")

    sets: dict[str, Any] = {}
    seconds: dict[str, dict[str, float]] = {}
    for data in _load_sets(args):
        texts = [e.text for e in data.examples]
        ours, ours_seconds = run_ours(scrubber, texts, args.batch_size, f"ours on {data.name}")
        vanilla, vanilla_seconds = run_vanilla(
            analyzer, anonymizer, texts, f"vanilla on {data.name}"
        )
        seconds[data.name] = {"ours": ours_seconds, "vanilla": vanilla_seconds}
        halves = split_halves(data.examples)
        sets[data.name] = {"title": data.title}
        for half, positions in halves.items():
            sets[data.name][half] = {
                "ours": measure(data, ours, positions),
                "vanilla": measure(data, vanilla, positions),
            }
        everything = range(len(data.examples))
        sets[data.name]["all"] = {
            "ours": measure(data, ours, everything),
            "vanilla": measure(data, vanilla, everything),
        }

    synth_texts = [e.text for e in load_synth(args.synth_n or None)]
    rng = random.Random(args.seed)
    speed_n = min(args.speed_n or len(synth_texts), len(synth_texts))
    same = [synth_texts[i] for i in rng.sample(range(len(synth_texts)), speed_n)]
    # Timed back to back on the same records: vanilla, ours, vanilla, ours.
    _, vanilla_a = run_vanilla(analyzer, anonymizer, same, "vanilla (speed)")
    _, ours_a = run_ours(scrubber, same, args.batch_size, "ours (speed)")
    _, vanilla_b = run_vanilla(analyzer, anonymizer, same, "vanilla (speed)")
    _, ours_b = run_ours(scrubber, same, args.batch_size, "ours (speed)")
    chars = sum(len(t) for t in same)
    speed = {
        "records": len(same),
        "chars": chars,
        "ours_chars_per_s": round(2 * chars / (ours_a + ours_b)),
        "vanilla_chars_per_s": round(2 * chars / (vanilla_a + vanilla_b)),
    }
    speed["speedup"] = round(speed["ours_chars_per_s"] / speed["vanilla_chars_per_s"], 2)

    results: dict[str, Any] = {
        "split": "half_of: SHA-256 of the document's UTF-8 text, first byte even -> tune, "
        "odd -> heldout; the rules may be tuned on tune halves only",
        "sets": sets,
        "goals": check_goals(sets),
        "speed": speed,
        "load_seconds": round(load_ours, 2),
    }
    print_tables(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        console.print(f"results written to {args.json}")
    return 0


_ROWS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("person names leaked", ("person", "leak")),
    ("person names replaced whole", ("person", "full")),
    ("person characters replaced (recall)", ("person", "recall")),
    ("high-risk values leaked", ("high_risk", "leak")),
    ("all scrubbed types leaked", ("overall", "leak")),
    ("non-PII kept", ("non_pii_kept",)),
    ("over-replacement", ("over_replacement",)),
)


def _fmt(value: float | None, percent: bool = True) -> str:
    if value is None:
        return "-"
    return f"{value:.1%}" if percent else f"{value:.2f}x"


def print_tables(results: dict[str, Any]) -> None:
    """Print the results as rich tables on stdout: per set, tune vs held-out, ours vs
    vanilla; then the goals on the held-out halves and the speed."""
    out = Console(width=140)
    for data in results["sets"].values():
        tune, held = data["tune"], data["heldout"]
        table = Table(
            title=f"{data['title']}: tune {tune['ours']['documents']} / "
            f"held-out {held['ours']['documents']} documents"
        )
        for column in (
            "figure",
            "ours, tune",
            "ours, held-out",
            "vanilla, tune",
            "vanilla, held-out",
            "held-out: ours - vanilla",
            "held-out: ours / vanilla",
        ):
            if column == "figure":
                table.add_column(column, no_wrap=True)
            else:
                table.add_column(column, justify="right")
        for label, path in _ROWS:
            if path[0] not in held["ours"]:
                continue
            values = [
                figure_of(part[system], path)
                for system in ("ours", "vanilla")
                for part in (tune, held)
            ]
            versus = compare(values[1], values[3])
            label_spans = ""
            if path[0] in {"person", "high_risk", "overall"}:
                label_spans = f" ({held['ours'][path[0]]['spans']} held-out)"
            table.add_row(
                label + label_spans,
                *(_fmt(v) for v in values),
                f"{versus['difference']:+.1%}",
                _fmt(versus["ratio"], percent=False),
            )
        out.print(table)
    goals = Table(title="Goals, on the held-out halves")
    for column in ("goal", "bound", "ours", "vanilla", "met"):
        goals.add_column(column, justify="left" if column == "goal" else "right")
    for goal in results["goals"]:
        goals.add_row(
            goal["goal"],
            f"{goal['bound']} {goal['limit']:.0%}",
            _fmt(goal["ours"]),
            _fmt(goal["vanilla"]),
            "yes" if goal["met"] else "[b]NO",
        )
    out.print(goals)
    speed = results["speed"]
    out.print(
        f"speed on {speed['records']} synth records ({speed['chars']:,} characters), one "
        f"process: ours {speed['ours_chars_per_s']:,} chars/s, vanilla Presidio "
        f"{speed['vanilla_chars_per_s']:,} chars/s ({speed['speedup']:.2f}x); "
        f"scrubber load {results['load_seconds']:.1f} s. Halves: {results['split']}."
    )


if __name__ == "__main__":
    sys.exit(main())
