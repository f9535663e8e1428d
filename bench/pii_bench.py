"""Benchmark the PII scrubber against vanilla Presidio: recall, leaks, over-replacement, speed.

Run from the repository root::

    .venv/bin/python bench/pii_bench.py [--synth-n N] [--vanilla-n N] [--json results.json]

Data comes from ``<repo>/../shared/data`` (presidio-research synth_dataset_v2,
weibo-ner dev and train, wnut17 dev); the run stops with a clear message when it is
absent. Definitions used in the table:

* recall: share of the gold entities' non-space characters that were replaced
  (any placeholder counts: a name replaced as an address is still gone);
* full: share of gold entities replaced entirely; hit: share with any character replaced;
* leak: share of gold values that still appear verbatim in the output;
* over-replacement: share of non-space characters outside every gold span
  that were replaced;
* non-PII tokens kept: share of the word tokens (whitespace-separated, holding a
  letter or digit) outside every gold span that come out with no character
  replaced; on wnut17 every token outside a gold person counts as non-PII;
* weibo names: "whole" is the share of PER.NAM names replaced entirely, "partly"
  the share with some but not all characters replaced (PER.NOM such as 老师 is
  not PII and not scored);
* chars/s: input characters per second of wall time on the same records,
  one process, models loaded beforehand, no caching across records.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

REPO = Path(__file__).resolve().parents[1]
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
LEAK_TYPES = ("EMAIL_ADDRESS", "PHONE_NUMBER", "CREDIT_CARD", "US_SSN", "IBAN_CODE", "IP_ADDRESS")
console = Console(stderr=True)
_WORD_TOKEN = re.compile(r"\S+")
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


def run_vanilla(analyzer: Any, anonymizer: Any, texts: Sequence[str]) -> tuple[list[Scored], float]:
    """Analyze and anonymize each text, the way Presidio's README does it."""
    results: list[Scored] = []
    elapsed = 0.0
    with _progress() as progress:
        task = progress.add_task("vanilla Presidio", total=len(texts))
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


def _share(evaluation: Evaluation, entity_type: str, field: str) -> float:
    score = evaluation.by_type.get(entity_type, TypeScore())
    return getattr(score, field) / score.spans if score.spans else 0.0


def _fmt(value: float) -> str:
    return f"{value:.3f}"


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print the tables; optionally write JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--synth-n", type=int, default=0, help="synth sentences (0 = all 1,500)")
    parser.add_argument(
        "--vanilla-n",
        type=int,
        default=0,
        help="records for the speed and recall comparison, the same for both (0 = all)",
    )
    parser.add_argument("--wnut-n", type=int, default=0, help="wnut17 sentences (0 = all)")
    parser.add_argument("--weibo-split", default="dev", choices=("dev", "train"))
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

    synth = load_synth(args.synth_n or None)
    ours_synth, ours_synth_seconds = run_ours(
        scrubber, [e.text for e in synth], args.batch_size, "ours on synth"
    )
    ours_eval = evaluate(synth, ours_synth)

    rng = random.Random(args.seed)
    sample = rng.sample(range(len(synth)), min(args.vanilla_n or len(synth), len(synth)))
    same = [synth[i] for i in sample]
    same_texts = [e.text for e in same]
    # Measured back to back on the same records: vanilla, ours, vanilla, ours.
    vanilla_scored, vanilla_seconds_a = run_vanilla(analyzer, anonymizer, same_texts)
    ours_same, ours_seconds_a = run_ours(scrubber, same_texts, args.batch_size, "ours (speed)")
    _, vanilla_seconds_b = run_vanilla(analyzer, anonymizer, same_texts)
    _, ours_seconds_b = run_ours(scrubber, same_texts, args.batch_size, "ours (speed)")
    chars = sum(len(t) for t in same_texts)
    vanilla_cps = 2 * chars / (vanilla_seconds_a + vanilla_seconds_b)
    ours_cps = 2 * chars / (ours_seconds_a + ours_seconds_b)
    vanilla_eval = evaluate(same, vanilla_scored)
    ours_same_eval = evaluate(same, ours_same)

    weibo = load_weibo(args.weibo_split)
    weibo_scored, weibo_seconds = run_ours(
        scrubber, [e.text for e in weibo], args.batch_size, f"ours on weibo {args.weibo_split}"
    )
    weibo_eval = evaluate(weibo, weibo_scored)
    # The Chinese name rules are developed on train and checked on dev; held-out
    # text looks like either, so both are reported.
    weibo_train = load_weibo("train")
    weibo_train_scored, weibo_train_seconds = run_ours(
        scrubber, [e.text for e in weibo_train], args.batch_size, "ours on weibo train"
    )
    weibo_train_eval = evaluate(weibo_train, weibo_train_scored)
    wnut = load_wnut(args.wnut_n or None)
    wnut_texts = [e.text for e in wnut]
    wnut_scored, _ = run_ours(scrubber, wnut_texts, args.batch_size, "ours on wnut17")
    wnut_eval = evaluate(wnut, wnut_scored)
    wnut_vanilla, _ = run_vanilla(analyzer, anonymizer, wnut_texts)
    wnut_vanilla_eval = evaluate(wnut, wnut_vanilla)

    overall = ours_eval.overall(TARGET_TYPES)
    leak_all = ours_eval.overall(LEAK_TYPES)
    results: dict[str, Any] = {
        "synth": {
            "n": len(synth),
            "per_type": {t: ours_eval.by_type.get(t, TypeScore()).as_dict() for t in TARGET_TYPES},
            "overall": overall.as_dict(),
            "leak_rate_six_types": round(leak_all.leaked / leak_all.spans, 4)
            if leak_all.spans
            else 0,
            "over_replacement": round(ours_eval.over_replacement, 4),
            "non_pii_tokens_kept": round(tokens_kept(synth, ours_synth), 4),
            "chars_per_s": round(sum(len(e.text) for e in synth) / ours_synth_seconds),
        },
        "same_records": {
            "n": len(same),
            "chars": chars,
            "ours": {
                "chars_per_s": round(ours_cps),
                "overall": ours_same_eval.overall(TARGET_TYPES).as_dict(),
                "over_replacement": round(ours_same_eval.over_replacement, 4),
            },
            "vanilla": {
                "chars_per_s": round(vanilla_cps),
                "overall": vanilla_eval.overall(TARGET_TYPES).as_dict(),
                "per_type": {
                    t: vanilla_eval.by_type.get(t, TypeScore()).as_dict() for t in TARGET_TYPES
                },
                "over_replacement": round(vanilla_eval.over_replacement, 4),
            },
            "speedup": round(ours_cps / vanilla_cps, 2),
        },
        "weibo": _weibo_results(args.weibo_split, weibo, weibo_eval, weibo_seconds),
        "weibo_train": _weibo_results("train", weibo_train, weibo_train_eval, weibo_train_seconds),
        "wnut17": {
            "n": len(wnut),
            "person": wnut_eval.by_type.get("person", TypeScore()).as_dict(),
            "over_replacement": round(wnut_eval.over_replacement, 4),
            "non_pii_tokens_kept": round(tokens_kept(wnut, wnut_scored, ["person"]), 4),
            "vanilla_person": wnut_vanilla_eval.by_type.get("person", TypeScore()).as_dict(),
            "vanilla_non_pii_tokens_kept": round(tokens_kept(wnut, wnut_vanilla, ["person"]), 4),
        },
        "load_seconds": round(load_ours, 2),
    }
    print_tables(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        console.print(f"results written to {args.json}")
    return 0


def _weibo_results(
    split: str, examples: Sequence[Example], evaluation: Evaluation, seconds: float
) -> dict[str, Any]:
    """PER.NAM scores on one weibo-ner split, for the table and the JSON file."""
    return {
        "split": split,
        "n": len(examples),
        "person": evaluation.by_type.get("PER.NAM", TypeScore()).as_dict(),
        "names_whole": round(_share(evaluation, "PER.NAM", "full"), 4),
        "names_partly": round(
            _share(evaluation, "PER.NAM", "hit") - _share(evaluation, "PER.NAM", "full"), 4
        ),
        "over_replacement": round(evaluation.over_replacement, 4),
        "chars_per_s": round(sum(len(e.text) for e in examples) / seconds),
    }


def print_tables(results: dict[str, Any]) -> None:
    """Print the results as rich tables on stdout."""
    out = Console()
    synth = results["synth"]
    same = results["same_records"]
    table = Table(title=f"presidio-research synth_dataset_v2 ({synth['n']} sentences): ours")
    for column in (
        "entity type",
        "spans",
        "recall",
        "full",
        "leak",
        "vanilla recall*",
        "vanilla leak*",
    ):
        table.add_column(column, justify="right" if column != "entity type" else "left")
    for name in TARGET_TYPES:
        score = synth["per_type"][name]
        vanilla = same["vanilla"]["per_type"][name]
        table.add_row(
            name,
            str(score["spans"]),
            _fmt(score["recall"]),
            _fmt(score["full"]),
            _fmt(score["leak"]),
            _fmt(vanilla["recall"]),
            _fmt(vanilla["leak"]),
        )
    table.add_row(
        "[b]overall (8 types)",
        str(synth["overall"]["spans"]),
        f"[b]{_fmt(synth['overall']['recall'])}",
        _fmt(synth["overall"]["full"]),
        _fmt(synth["overall"]["leak"]),
        _fmt(same["vanilla"]["overall"]["recall"]),
        _fmt(same["vanilla"]["overall"]["leak"]),
    )
    out.print(table)
    out.print(
        f"* vanilla on the {same['n']} records of the speed run. "
        f"Leak rate over email/phone/card/SSN/IBAN/IP: {synth['leak_rate_six_types']:.3%}. "
        f"Over-replacement (non-gold characters replaced): ours {synth['over_replacement']:.2%}; "
        f"non-PII tokens kept: {synth['non_pii_tokens_kept']:.2%}."
    )

    speed = Table(title=f"Same {same['n']} records ({same['chars']:,} characters), one process")
    for column in ("system", "chars/s", "recall (8 types)", "full", "leak", "over-replacement"):
        speed.add_column(column, justify="right" if column != "system" else "left")
    for name in ("ours", "vanilla"):
        row = same[name]
        speed.add_row(
            "ours" if name == "ours" else "vanilla Presidio",
            f"{row['chars_per_s']:,}",
            _fmt(row["overall"]["recall"]),
            _fmt(row["overall"]["full"]),
            _fmt(row["overall"]["leak"]),
            f"{row['over_replacement']:.2%}",
        )
    speed.add_row("[b]speed-up", f"[b]{same['speedup']:.2f}x", "", "", "", "")
    out.print(speed)

    names = Table(title="Person names on real text")
    for column in (
        "data set",
        "names",
        "recall",
        "hit",
        "full",
        "leak",
        "over-repl.",
        "non-PII tokens kept",
        "chars/s",
    ):
        names.add_column(column, justify="right" if column != "data set" else "left")
    weibo, weibo_train, wnut = results["weibo"], results["weibo_train"], results["wnut17"]
    for split in (weibo, weibo_train):
        names.add_row(
            f"weibo-ner {split['split']} PER.NAM, ours",
            str(split["person"]["spans"]),
            _fmt(split["person"]["recall"]),
            _fmt(split["person"]["hit"]),
            _fmt(split["person"]["full"]),
            _fmt(split["person"]["leak"]),
            f"{split['over_replacement']:.2%}",
            "",
            f"{split['chars_per_s']:,}",
        )
    for label, person, kept, over in (
        (
            "wnut17 dev person, ours",
            wnut["person"],
            wnut["non_pii_tokens_kept"],
            f"{wnut['over_replacement']:.2%}",
        ),
        (
            "wnut17 dev person, vanilla",
            wnut["vanilla_person"],
            wnut["vanilla_non_pii_tokens_kept"],
            "",
        ),
    ):
        names.add_row(
            label,
            str(person["spans"]),
            _fmt(person["recall"]),
            _fmt(person["hit"]),
            _fmt(person["full"]),
            _fmt(person["leak"]),
            over,
            f"{kept:.2%}",
            "",
        )
    out.print(names)
    out.print(
        f"weibo {weibo['split']} names replaced whole: {weibo['names_whole']:.1%}, "
        f"partly: {weibo['names_partly']:.1%}; weibo train (the rules' development split) "
        f"names replaced whole: {weibo_train['names_whole']:.1%}, "
        f"partly: {weibo_train['names_partly']:.1%}; wnut17 dev person names leaked: ours "
        f"{wnut['person']['leak']:.1%}, vanilla Presidio {wnut['vanilla_person']['leak']:.1%}; "
        f"non-PII tokens kept on wnut17: ours {wnut['non_pii_tokens_kept']:.1%}, "
        f"vanilla {wnut['vanilla_non_pii_tokens_kept']:.1%}; "
        f"speed-up {results['same_records']['speedup']:.2f}x vanilla Presidio (same run)."
    )


if __name__ == "__main__":
    sys.exit(main())
