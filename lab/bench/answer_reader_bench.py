"""The satisfaction model's reading across a loop's nights, with the reader's feature cache and
without it, in one process as ``flywheel loop`` runs the nights.

    FLYWHEEL_HOME=<a loop's home> .venv/bin/python lab/bench/answer_reader_bench.py \\
        --line customer_service [--nights N]

For each night's dataset, oldest first, reads the labelled answers the night's satisfaction
model trains and is judged on (``labelled_splits``: every window up to that night) with two
readers of the same base model: one keeping its cache across the nights (as one process does),
one with none (``cache_rows=0``, as before the cache). Prints, per night, the rows the base
model read and the seconds each took, and the ratio; the features are checked equal.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main() -> None:
    """Read each night's labelled answers with and without the cache; print the ratios."""
    import numpy as np

    from composition.recipes import recipe_for
    from eval.satisfaction_model import AnswerReader
    from eval.satisfaction_training import labelled_splits
    from feedback.datasets import line_builds
    from flywheel.settings import load_settings
    from lab.commands.loop import loop_settings
    from training.base_model import ensure_base_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--line", default="customer_service")
    parser.add_argument("--nights", type=int, default=None, help="the first N nights only")
    args = parser.parse_args()
    settings = loop_settings(load_settings())
    policy = recipe_for(settings, args.line).satisfaction_model
    base = ensure_base_model(settings.models_dir, settings.base_model)
    cached, uncached = AnswerReader(base), AnswerReader(base, cache_rows=0)
    builds = line_builds(settings.datasets_dir, args.line)[: args.nights]
    print(f"{args.line}: {len(builds)} nights' datasets in {settings.datasets_dir}")
    print("night  answers  read (cache)  s (cache)  read (none)  s (none)  time ratio")
    totals = [0.0, 0.0]
    for night, build in enumerate(builds, start=1):
        train, heldout = labelled_splits(
            settings, args.line, build.content_hash, policy.max_examples
        )
        items = [(a.prompt, a.answer) for a in [*train, *heldout]]
        seconds, rows, features = [], [], []
        for reader in (cached, uncached):
            before, started = reader.forward_rows, time.perf_counter()
            features.append(reader.features(items))
            seconds.append(time.perf_counter() - started)
            rows.append(reader.forward_rows - before)
        if items:
            np.testing.assert_allclose(features[0], features[1], rtol=1e-3, atol=1e-4)
        totals = [totals[0] + seconds[0], totals[1] + seconds[1]]
        print(
            f"{night:>5}  {len(items):>7}  {rows[0]:>12}  {seconds[0]:>9.1f}  {rows[1]:>11}  "
            f"{seconds[1]:>8.1f}  {seconds[1] / max(seconds[0], 1e-9):>9.2f}x"
        )
    print(f"all nights: {totals[0]:.1f} s with the cache, {totals[1]:.1f} s without: "
          f"{totals[1] / max(totals[0], 1e-9):.2f}x")  # fmt: skip


if __name__ == "__main__":
    main()
