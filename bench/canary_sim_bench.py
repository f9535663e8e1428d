"""The canary's sequential test against the old Bonferroni rule, by simulation.

Run from the repository root::

    .venv/bin/python bench/canary_sim_bench.py [--runs 4000] [--seed 0] [--json results.json]

Simulated canaries on a 10% share (the champion gets 9x the canary's traffic),
eight rates (thumbs-down 0.10, regenerate 0.05, edit 0.03, error 0.01, abandon
0.05, task failure 0.03, dissatisfied 0.20, refusal 0.02), the production
policy (``CanaryPolicy()``: alpha 0.05, default margins, 200 requests per arm
before any decision) with 50 looks of growing data. Three rules:

* **sequential**: the product's rule (``registry.canary``): always-valid
  mSPRT p-values, "worse" at alpha / (rates + 1) (the output length is the
  ninth such test; its data is not simulated here), non-inferiority at alpha;
* **bonferroni**: the rule it replaced: pooled z-test for "worse", Wald z-test
  for non-inferiority, each at alpha / (looks x rates);
* **fixed z**: the fixed-sample score tests (statsmodels' ``method="score"``) at
  the same levels on every look (no correction for looking): what anytime
  validity is for.

(a) Type I errors over all 50 looks, counted whether or not the run would have
stopped earlier (the strict event; the real error is at most this): equal rates,
any rate ever called worse (also with a 20-request floor, the demo's); one rate
worse by exactly its margin (the hardest such case), that rate ever called
non-inferior. Shares with a Wilson 95% interval.

(b) Canary requests to a correct decision (the first look that is not "wait"):
clearly worse canaries (thumbs-down 0.20 or 0.15 vs 0.10: roll back) and a fine
one (equal rates: promote); medians and means over the runs decided correctly,
power (the share decided correctly within 50 looks) and the ratio of medians
sequential / bonferroni; for the fine canary also each rate's median requests
to its first non-inferior verdict.

The product's ``decide_canary`` is replayed on the first runs of each scenario
and must agree with the vectorised rule look by look.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from registry.canary import (
    RATES,
    ArmStats,
    CanaryAction,
    CanaryPolicy,
    decide_canary,
    normal_sf,
    score_test,
    sequential_p_values,
)

BASE_RATES = {
    "thumbs_down": 0.10,
    "regenerate": 0.05,
    "edit": 0.03,
    "error": 0.01,
    "abandon": 0.05,
    "task_failure": 0.03,
    "dissatisfied": 0.20,
    "refusal": 0.02,
}
LOOKS = 50
CANARY_SHARE = 0.10
POLICY = CanaryPolicy(max_looks=LOOKS)
DEMO_FLOOR = 20
MARGINS = np.array([POLICY.margin(name) for name in RATES])
WAIT, PROMOTE, ROLLBACK, OUT_OF_LOOKS = 0, 1, 2, 3  # out of looks: a rollback, unproven
REPLAYED_RUNS = 10


@dataclass(frozen=True)
class Scenario:
    """True rates of the canary (the champion has BASE_RATES) and its requests per look."""

    name: str
    canary_rates: dict[str, float]
    canary_per_look: int

    @property
    def champion_per_look(self) -> int:
        return round(self.canary_per_look * (1 - CANARY_SHARE) / CANARY_SHARE)


@dataclass(frozen=True)
class Counts:
    """Cumulative counts at every look: hits (runs, looks, rates), requests (looks,)."""

    champion_hits: np.ndarray
    champion_n: np.ndarray
    canary_hits: np.ndarray
    canary_n: np.ndarray

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Broadcastable (champion hits, champion n, canary hits, canary n)."""
        return (
            self.champion_hits,
            self.champion_n[None, :, None],
            self.canary_hits,
            self.canary_n[None, :, None],
        )

    def enough(self, floor: int) -> np.ndarray:
        """(1, looks, 1): looks with at least ``floor`` requests per arm."""
        return (np.minimum(self.champion_n, self.canary_n) >= floor)[None, :, None]


Verdicts = tuple[np.ndarray, np.ndarray]  # worse, non-inferior: (runs, looks, rates) bools
Rule = Callable[[Counts], Verdicts]


def simulate(scenario: Scenario, runs: int, rng: np.random.Generator) -> Counts:
    """Binomial traffic per look, accumulated over the looks."""
    champion = np.array([BASE_RATES[name] for name in RATES])
    canary = np.array([scenario.canary_rates.get(name, BASE_RATES[name]) for name in RATES])
    shape = (runs, LOOKS, len(RATES))
    looks = np.arange(1, LOOKS + 1)
    return Counts(
        champion_hits=rng.binomial(scenario.champion_per_look, champion, shape).cumsum(axis=1),
        champion_n=looks * scenario.champion_per_look,
        canary_hits=rng.binomial(scenario.canary_per_look, canary, shape).cumsum(axis=1),
        canary_n=looks * scenario.canary_per_look,
    )


def sequential_rule(counts: Counts) -> Verdicts:
    """The product's rule."""
    worse_p, non_inferior_p = sequential_p_values(*counts.arrays(), MARGINS)
    worse = worse_p <= POLICY.worse_alpha
    return worse, ~worse & (non_inferior_p <= POLICY.non_inferior_alpha)


def fixed_z_rule(counts: Counts) -> Verdicts:
    """Fixed-sample score tests at the same levels, every look."""
    worse_z, _ = score_test(*counts.arrays(), 0.0)
    inferior_z, _ = score_test(*counts.arrays(), MARGINS)
    worse = normal_sf(worse_z) <= POLICY.worse_alpha
    return worse, ~worse & (normal_sf(-inferior_z) <= POLICY.non_inferior_alpha)


def bonferroni_rule(counts: Counts) -> Verdicts:
    """The replaced rule: z-tests at alpha / (looks x rates) each."""
    champion_hits, champion_n, canary_hits, canary_n = counts.arrays()
    per_test = POLICY.alpha / (LOOKS * len(RATES))
    p_champion, p_canary = champion_hits / champion_n, canary_hits / canary_n
    difference = p_canary - p_champion
    pooled = (champion_hits + canary_hits) / (champion_n + canary_n)
    pooled_variance = pooled * (1 - pooled) * (1 / champion_n + 1 / canary_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        worse_p = np.where(
            pooled_variance > 0,
            normal_sf(difference / np.sqrt(pooled_variance)),
            np.where(difference > 0, 0.0, 1.0),
        )
    floor_champion = np.clip(p_champion, 0.5 / champion_n, 1 - 0.5 / champion_n)
    floor_canary = np.clip(p_canary, 0.5 / canary_n, 1 - 0.5 / canary_n)
    wald_variance = (
        floor_champion * (1 - floor_champion) / champion_n
        + floor_canary * (1 - floor_canary) / canary_n
    )
    non_inferior_p = normal_sf(-(difference - MARGINS) / np.sqrt(wald_variance))
    worse = worse_p < per_test
    return worse, ~worse & (non_inferior_p < per_test)


RULES: dict[str, Rule] = {
    "sequential": sequential_rule,
    "bonferroni": bonferroni_rule,
    "fixed z": fixed_z_rule,
}


def actions(counts: Counts, verdicts: Verdicts, floor: int) -> np.ndarray:
    """The action at every look (runs, looks), as decide_canary takes it."""
    worse, non_inferior = verdicts
    action = np.where(
        worse.any(axis=2), ROLLBACK, np.where(non_inferior.all(axis=2), PROMOTE, WAIT)
    )
    action = np.where(counts.enough(floor)[:, :, 0], action, WAIT)
    action[:, -1] = np.where(action[:, -1] == WAIT, OUT_OF_LOOKS, action[:, -1])
    return action


def first_decision(action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per run: the first look (0-based) that is not "wait", and its action."""
    look = np.argmax(action != WAIT, axis=1)
    return look, action[np.arange(len(action)), look]


def wilson(hits: int, n: int, z: float = 1.959964) -> tuple[float, float]:
    """Wilson score 95% interval of a binomial share."""
    share = hits / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(share * (1 - share) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def replay(counts: Counts, action: np.ndarray) -> int:
    """decide_canary on the first runs, look by look, against the vectorised actions;
    the number of looks compared."""
    codes = {
        CanaryAction.WAIT: WAIT,
        CanaryAction.PROMOTE: PROMOTE,
        CanaryAction.ROLLBACK: ROLLBACK,
    }
    expected = np.where(action == OUT_OF_LOOKS, ROLLBACK, action)
    runs = min(REPLAYED_RUNS, len(action))
    for run in range(runs):
        for look in range(LOOKS):
            champion, canary = (
                ArmStats(
                    None, int(n[look]), **{r: int(hits[run, look, i]) for i, r in enumerate(RATES)}
                )
                for hits, n in (
                    (counts.champion_hits, counts.champion_n),
                    (counts.canary_hits, counts.canary_n),
                )
            )
            decision = decide_canary(champion, canary, POLICY, look=look + 1).action
            if codes[decision] != expected[run, look]:
                raise AssertionError(
                    f"decide_canary says {decision} at run {run} look {look + 1}, "
                    f"the vectorised rule {expected[run, look]}"
                )
    return runs * LOOKS


def _share(wrong: np.ndarray) -> dict[str, Any]:
    hits, runs = int(wrong.sum()), len(wrong)
    return {"share": hits / runs, "ci95": list(wilson(hits, runs))}


def type_one_errors(runs: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """(a): strict error shares over all looks, per rule."""
    rows: list[dict[str, Any]] = []
    equal = simulate(Scenario("equal rates", {}, 40), runs, rng)
    verdicts = {name: rule(equal) for name, rule in RULES.items()}
    for floor in (POLICY.min_requests, DEMO_FLOOR):
        for name, (worse, _) in verdicts.items():
            wrong = (worse & equal.enough(floor)).any(axis=(1, 2))
            rows.append(
                {
                    "scenario": f"equal rates, floor {floor}",
                    "event": "any rate called worse",
                    "rule": name,
                    **_share(wrong),
                    "per_rate": dict(
                        zip(
                            RATES,
                            (worse & equal.enough(floor)).any(axis=1).mean(axis=0).tolist(),
                            strict=True,
                        )
                    ),
                }
            )
    replayed = replay(equal, actions(equal, verdicts["sequential"], POLICY.min_requests))
    rows[0]["replayed_looks"] = replayed
    for rate in ("thumbs_down", "error"):
        worse_by_margin = {rate: BASE_RATES[rate] + POLICY.margin(rate)}
        counts = simulate(Scenario(f"{rate} worse by its margin", worse_by_margin, 100), runs, rng)
        index = RATES.index(rate)
        for name, rule in RULES.items():
            _, non_inferior = rule(counts)
            wrong = (non_inferior & counts.enough(POLICY.min_requests))[:, :, index].any(axis=1)
            rows.append(
                {
                    "scenario": f"{rate} +{POLICY.margin(rate):g} (its margin)",
                    "event": f"{rate} called non-inferior",
                    "rule": name,
                    **_share(wrong),
                }
            )
    return rows


def samples_to_decision(
    runs: int, rng: np.random.Generator, floor: int = POLICY.min_requests
) -> dict[str, Any]:
    """(b): canary requests to a correct decision, per rule, deciding from ``floor``
    requests per arm (decide_canary is replayed at the policy's own floor)."""
    results: dict[str, Any] = {}
    for scenario, correct in (
        (Scenario("worse: thumbs-down 0.20 vs 0.10", {"thumbs_down": 0.20}, 20), ROLLBACK),
        (Scenario("worse: thumbs-down 0.15 vs 0.10", {"thumbs_down": 0.15}, 40), ROLLBACK),
        (Scenario("fine: equal rates", {}, 100), PROMOTE),
    ):
        counts = simulate(scenario, runs, rng)
        rows: dict[str, Any] = {}
        for name, rule in RULES.items():
            verdicts = rule(counts)
            action = actions(counts, verdicts, floor)
            look, decided = first_decision(action)
            right = decided == correct
            requests = counts.canary_n[look[right]]
            rows[name] = {
                "power": float(right.mean()),
                "median": float(np.median(requests)) if right.any() else math.nan,
                "mean": float(requests.mean()) if right.any() else math.nan,
            }
            if correct == PROMOTE:
                ok = verdicts[1] & counts.enough(floor)
                first = np.where(ok.any(axis=1), ok.argmax(axis=1), LOOKS - 1)
                rows[name]["median_to_first_non_inferior"] = dict(
                    zip(RATES, np.median(counts.canary_n[first], axis=0).tolist(), strict=True)
                )
            if rule is sequential_rule:
                replayed = replay(counts, action) if floor == POLICY.min_requests else 0
                rows[name]["replayed_looks"] = replayed
        rows["ratio"] = rows["sequential"]["median"] / rows["bonferroni"]["median"]
        results[scenario.name] = rows
    return results


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=4000, help="Simulated canaries per scenario.")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="Write the numbers here too.")
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    started = time.perf_counter()
    errors = type_one_errors(args.runs, rng)
    samples = samples_to_decision(args.runs, rng)
    # Where the 200-request floor binds, both rules decide at it; from the demo's floor
    # (where the sequential rule's type I error is still under alpha, part a) the tests do.
    samples_low_floor = samples_to_decision(args.runs, rng, DEMO_FLOOR)
    elapsed = time.perf_counter() - started

    print(
        f"{args.runs} runs per scenario, {LOOKS} looks, alpha {POLICY.alpha}, "
        f"{POLICY.min_requests} requests per arm before deciding, seed {args.seed}"
    )
    print(f"\n(a) type I error over {LOOKS} looks (strict: ever, whether or not it stopped)")
    print(f"{'scenario':<28} {'event':<32} {'rule':<11} {'share':>7}  95% interval")
    for row in errors:
        low, high = row["ci95"]
        print(
            f"{row['scenario']:<28} {row['event']:<32} {row['rule']:<11} "
            f"{row['share']:>7.4f}  [{low:.4f}, {high:.4f}]"
        )
    print(f"  per rate, sequential, floor {POLICY.min_requests} (each at most alpha/rates ", end="")
    print(f"= {POLICY.worse_alpha:.4f}): ", end="")
    print(", ".join(f"{rate} {share:.4f}" for rate, share in errors[0]["per_rate"].items()))
    for floor, block in ((POLICY.min_requests, samples), (DEMO_FLOOR, samples_low_floor)):
        print(f"\n(b) canary requests to a correct decision, deciding from {floor} per arm")
        print(f"{'scenario':<34} {'rule':<11} {'power':>6} {'median':>8} {'mean':>8}")
        for name, rows in block.items():
            for rule in RULES:
                row = rows[rule]
                print(
                    f"{name:<34} {rule:<11} {row['power']:>6.3f} {row['median']:>8.0f} "
                    f"{row['mean']:>8.0f}"
                )
            print(f"{'':<34} ratio of medians sequential/bonferroni: {rows['ratio']:.3f}")
    fine = samples["fine: equal rates"]
    print("  fine canary, median canary requests to each rate's first non-inferior verdict:")
    for rule in ("sequential", "bonferroni"):
        firsts = fine[rule]["median_to_first_non_inferior"]
        print(f"    {rule:<11} " + ", ".join(f"{r} {n:.0f}" for r, n in firsts.items()))
    replayed = errors[0]["replayed_looks"] + sum(
        rows["sequential"]["replayed_looks"] for rows in samples.values()
    )
    print(f"\ndecide_canary agreed with the vectorised rule on {replayed} replayed looks")
    print(f"{elapsed:.1f} s")
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "runs": args.runs,
                    "seed": args.seed,
                    "looks": LOOKS,
                    "policy": POLICY.model_dump(),
                    "type_one_errors": errors,
                    "samples_to_decision": samples,
                    "samples_to_decision_from_demo_floor": samples_low_floor,
                    "seconds": elapsed,
                },
                indent=2,
            ),
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
