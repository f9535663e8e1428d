"""How soon the demo canary promotes a better adapter, by the spread of its non-inferiority
test: one mixture tuned to an equal canary (the rule before) against the mean of it and one
tuned to a clearly better canary (:data:`registry.canary.BETTER_DESIGN_EFFECT`).

Run from the repository root::

    .venv/bin/python lab/bench/canary_first_day_bench.py [--runs 500] [--recipe legal]

Each run is one canary of the loop at its true 5% share (``lab.simulation.canary_day``:
six looks a day of 250 requests, quiet users at the realistic profile, the recipe's blind
review shares with 10% of verdicts wrong, no satisfaction model), judged by the demo
recipe's policy. Printed per spread and scenario: the share promoted, promoted within the
first day (six looks; a canary still live at night holds the line's next training), rolled
back, and the median look of a promotion; then each spread's first-day promotions of the
better canaries as a ratio of the one-spread rule's, measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

# (champion, canary) satisfaction; the first two are the better canaries the ratio is on.
SCENARIOS = {
    "better, 0.25 -> 0.45": (0.25, 0.45),
    "better, 0.23 -> 0.41 (legal's v2)": (0.23, 0.41),
    "better by 0.10": (0.25, 0.35),
    "equal, 0.30": (0.30, 0.30),
    "worse by the margin (0.05)": (0.30, 0.25),
    "worse by 0.15": (0.45, 0.30),
    "inverted, 0.50 -> 0.10": (0.50, 0.10),
}
BETTER = ("better, 0.25 -> 0.45", "better, 0.23 -> 0.41 (legal's v2)")


def main() -> None:
    """Simulate every scenario under each spread and print the table and the ratios."""
    import registry.canary as canary_rule
    from composition.recipes import packaged_recipes_dir, read_recipe
    from lab.simulation.canary_day import LOOKS_A_DAY, share_canary

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=500)
    parser.add_argument("--recipe", default="legal", help="a demo recipe's line")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    recipe = read_recipe(packaged_recipes_dir() / "demo" / f"{args.recipe}.yaml")
    assert recipe.review is not None
    policy, shares = recipe.canary, dict(recipe.review.share)
    spreads = {
        "one spread (before)": canary_rule.NON_INFERIOR_DESIGN_EFFECT,
        **{f"1 + {effect:g} margins": effect for effect in (2.0, 3.0, 4.0)},
    }
    product = canary_rule.BETTER_DESIGN_EFFECT
    started = time.monotonic()
    results: dict[str, dict[str, dict[str, float | None]]] = {}
    print(
        f"{args.runs} runs per row; demo recipe {args.recipe}; the product's rule: 1 + {product:g}"
    )
    print(
        f"{'spread':22} {'scenario':36} {'promoted':>8} {'day 1':>6} {'rolled back':>11} "
        f"{'look':>5}"
    )
    try:
        for name, effect in spreads.items():
            # The rule's second spread; the same as the first reproduces the one-spread rule.
            canary_rule.BETTER_DESIGN_EFFECT = effect
            results[name] = {}
            for scenario, (champion, canary) in SCENARIOS.items():
                outcomes = [
                    share_canary(policy, shares, champion, canary, seed)
                    for seed in range(args.runs)
                ]
                looks = [o.look for o in outcomes if o.action == "promote"]
                row = {
                    "promoted": len(looks) / args.runs,
                    "first_day": sum(look <= LOOKS_A_DAY for look in looks) / args.runs,
                    "rolled_back": sum(o.action == "rollback" for o in outcomes) / args.runs,
                    "median_look": statistics.median(looks) if looks else None,
                }
                results[name][scenario] = row
                look = f"{row['median_look']:.1f}" if looks else "-"
                print(
                    f"{name:22} {scenario:36} {row['promoted']:8.3f} {row['first_day']:6.3f} "
                    f"{row['rolled_back']:11.3f} {look:>5}",
                    flush=True,
                )
    finally:
        canary_rule.BETTER_DESIGN_EFFECT = product
    baseline = "one spread (before)"
    for name in spreads:
        if name == baseline:
            continue
        ratios = [
            results[name][s]["first_day"] / results[baseline][s]["first_day"]  # type: ignore[operator]
            for s in BETTER
        ]
        shown = ", ".join(f"{r:.2f}x" for r in ratios)
        print(f"{name}: better canaries promoted on their first day {shown} the one-spread rule's")
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        args.json.write_text(
            json.dumps({"runs": args.runs, "recipe": args.recipe, "results": results}, indent=1)
        )


if __name__ == "__main__":
    main()
