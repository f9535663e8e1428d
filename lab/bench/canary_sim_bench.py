"""The canary's sequential test against the old Bonferroni rule, by simulation.

Run from the repository root::

    .venv/bin/python lab/bench/canary_sim_bench.py [--runs 4000] [--seed 0] [--json results.json]

Simulated canaries on a 10% share (the champion gets 9x the canary's traffic),
eight rates (thumbs-down 0.10, regenerate 0.05, edit 0.03, error 0.01, abandon
0.05, task failure 0.03, dissatisfied 0.20, refusal 0.02; drawn independently),
the production policy (``CanaryPolicy()``: alpha 0.05, default margins, 200
requests per arm before any decision) with 50 looks of growing data. The rules,
all at the same alpha and the same floor:

* **sequential**: the product's rule (``registry.canary``): mSPRT e-values tuned to
  the margins; roll back when the mean of the nine rollback tests' e-values (the
  rates and the output length, whose data is not simulated here: an e-value of 1)
  reaches 1 / alpha; promote when every rate is non-inferior at alpha;
* **bonferroni**: today's rule, the one it replaced: pooled z-test for "worse",
  Wald z-test for non-inferiority, each at alpha / (looks x rates);
* **bonf. score**: the same Bonferroni levels on the product's own statistics (the
  score tests, Yates' correction on "worse"): the boundary's effect alone, since
  the Wald test's speed on rare rates is partly its miscalibration (part a);
* **fixed z** (part a only): the fixed-sample score tests at the product's levels
  on every look, no correction for looking: what anytime validity is for.

(a) Type I errors over all 50 looks, counted whether or not the run would have
stopped earlier (the strict event; the real error is at most this): equal rates,
a rollback ever called (also with a 20-request floor, the demo's); one rate
worse by exactly its margin (the hardest such case), that rate ever called
non-inferior. Shares with a Wilson 95% interval.

(b) Per scenario and rule: power (the share decided correctly within 50 looks),
the wrong decision's share (a promotion of a worse canary, a rollback of a fine
one), and the canary requests to a correct decision (median and mean over the
runs decided correctly; the first look that is not "wait"), the share decided at
the floor (the first look with enough requests: no rule can be faster), and the
ratios sequential / bonferroni. A scenario whose median is the floor for both
rules is marked "floor-bound": its ratio says nothing about the tests.

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

from flywheel.intervals import wilson_interval
from registry.canary import (
    RATES,
    ArmStats,
    CanaryAction,
    CanaryPolicy,
    decide_canary,
    normal_sf,
    score_test,
    sequential_evidence,
    tuned_mixture_scale,
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
# Rollback tests whose data the simulation has none of (the output length): e-value 1.
UNSIMULATED_WORSE_TESTS = POLICY.worse_tests - len(RATES)


@dataclass(frozen=True)
class Scenario:
    """True rates of the canary (the champion has BASE_RATES), its requests per look, and
    the correct decision."""

    name: str
    canary_rates: dict[str, float]
    canary_per_look: int
    correct: int = ROLLBACK

    @property
    def champion_per_look(self) -> int:
        return round(self.canary_per_look * (1 - CANARY_SHARE) / CANARY_SHARE)


SCENARIOS = (
    Scenario("worse: thumbs-down 0.20 vs 0.10", {"thumbs_down": 0.20}, 20),
    Scenario("worse: thumbs-down 0.15 vs 0.10", {"thumbs_down": 0.15}, 40),
    Scenario("worse by its margin: td 0.13", {"thumbs_down": 0.13}, 100),
    Scenario(
        "worse all round: 4 rates +margin",
        {"thumbs_down": 0.13, "regenerate": 0.08, "edit": 0.06, "dissatisfied": 0.25},
        40,
    ),
    Scenario("worse, rare rate: error 0.03/0.01", {"error": 0.03}, 40),
    Scenario("fine: equal rates", {}, 100, PROMOTE),
)


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
        """(looks,): looks with at least ``floor`` requests per arm."""
        return np.minimum(self.champion_n, self.canary_n) >= floor


@dataclass(frozen=True)
class Verdicts:
    """Per run and look: a rollback is called, a promotion is earned; and per rate (runs,
    looks, rates): shown non-inferior."""

    rollback: np.ndarray
    promote: np.ndarray
    non_inferior: np.ndarray


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
    worse_e, non_inferior_e = sequential_evidence(
        *counts.arrays(),
        MARGINS,
        worse_alpha=POLICY.worse_alpha,
        non_inferior_alpha=POLICY.non_inferior_alpha,
    )
    mean_e = (worse_e.sum(axis=2) + UNSIMULATED_WORSE_TESTS) / POLICY.worse_tests
    rollback = mean_e >= 1 / POLICY.alpha
    non_inferior = non_inferior_e >= 1 / POLICY.non_inferior_alpha
    return Verdicts(rollback, ~rollback & non_inferior.all(axis=2), non_inferior)


def _bonferroni(worse_p: np.ndarray, non_inferior_p: np.ndarray) -> Verdicts:
    per_test = POLICY.alpha / (LOOKS * len(RATES))
    rollback = (worse_p < per_test).any(axis=2)
    non_inferior = non_inferior_p < per_test
    return Verdicts(rollback, ~rollback & non_inferior.all(axis=2), non_inferior)


def bonferroni_rule(counts: Counts) -> Verdicts:
    """Today's rule: pooled z for "worse", Wald z for non-inferiority, at alpha / (looks x
    rates) each."""
    champion_hits, champion_n, canary_hits, canary_n = counts.arrays()
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
    return _bonferroni(worse_p, non_inferior_p)


def _score_p_values(counts: Counts) -> tuple[np.ndarray, np.ndarray]:
    """Fixed-sample one-sided p-values of the product's statistics."""
    _, champion_n, _, canary_n = counts.arrays()
    worse_z, worse_variance = score_test(*counts.arrays(), 0.0)
    correction = 0.5 * (1 / champion_n + 1 / canary_n)
    with np.errstate(divide="ignore", invalid="ignore"):
        worse_z = np.where(worse_variance > 0, worse_z - correction / np.sqrt(worse_variance), 0.0)
    inferior_z, _ = score_test(*counts.arrays(), MARGINS)
    return normal_sf(worse_z), normal_sf(-inferior_z)


def bonferroni_score_rule(counts: Counts) -> Verdicts:
    """Today's Bonferroni levels on the product's statistics."""
    return _bonferroni(*_score_p_values(counts))


def fixed_z_rule(counts: Counts) -> Verdicts:
    """The product's statistics at fixed-sample levels on every look (Bonferroni over the
    rates only, as the product labels a single rate)."""
    worse_p, non_inferior_p = _score_p_values(counts)
    rollback = (worse_p <= POLICY.worse_alpha).any(axis=2)
    non_inferior = non_inferior_p <= POLICY.non_inferior_alpha
    return Verdicts(rollback, ~rollback & non_inferior.all(axis=2), non_inferior)


DECISION_RULES: dict[str, Rule] = {
    "sequential": sequential_rule,
    "bonferroni": bonferroni_rule,
    "bonf. score": bonferroni_score_rule,
}
RULES: dict[str, Rule] = {**DECISION_RULES, "fixed z": fixed_z_rule}


def actions(counts: Counts, verdicts: Verdicts, floor: int) -> np.ndarray:
    """The action at every look (runs, looks), as decide_canary takes it."""
    action = np.where(verdicts.rollback, ROLLBACK, np.where(verdicts.promote, PROMOTE, WAIT))
    action = np.where(counts.enough(floor)[None, :], action, WAIT)
    action[:, -1] = np.where(action[:, -1] == WAIT, OUT_OF_LOOKS, action[:, -1])
    return action


def first_decision(action: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per run: the first look (0-based) that is not "wait", and its action."""
    look = np.argmax(action != WAIT, axis=1)
    return look, action[np.arange(len(action)), look]


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
    return {"share": hits / runs, "ci95": list(wilson_interval(hits, runs))}


def type_one_errors(runs: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """(a): strict error shares over all looks, per rule."""
    rows: list[dict[str, Any]] = []
    equal = simulate(Scenario("equal rates", {}, 40, PROMOTE), runs, rng)
    verdicts = {name: rule(equal) for name, rule in RULES.items()}
    for floor in (POLICY.min_requests, DEMO_FLOOR):
        for name, verdict in verdicts.items():
            wrong = (verdict.rollback & equal.enough(floor)[None, :]).any(axis=1)
            rows.append(
                {
                    "scenario": f"equal rates, floor {floor}",
                    "event": "rollback ever called",
                    "rule": name,
                    **_share(wrong),
                }
            )
    replayed = replay(equal, actions(equal, verdicts["sequential"], POLICY.min_requests))
    rows[0]["replayed_looks"] = replayed
    for rate in ("thumbs_down", "error"):
        worse_by_margin = {rate: BASE_RATES[rate] + POLICY.margin(rate)}
        counts = simulate(Scenario(f"{rate} worse by its margin", worse_by_margin, 100), runs, rng)
        index = RATES.index(rate)
        enough = counts.enough(POLICY.min_requests)[None, :]
        for name, rule in RULES.items():
            wrong = (rule(counts).non_inferior[:, :, index] & enough).any(axis=1)
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
    """(b): per scenario and rule, power, wrong decisions and canary requests to a correct
    decision, deciding from ``floor`` requests per arm (decide_canary is replayed at the
    policy's own floor)."""
    results: dict[str, Any] = {}
    for scenario in SCENARIOS:
        counts = simulate(scenario, runs, rng)
        first_allowed = int(counts.canary_n[np.argmax(counts.enough(floor))])
        wrong_action = PROMOTE if scenario.correct == ROLLBACK else ROLLBACK
        rows: dict[str, Any] = {"floor_requests": first_allowed}
        for name, rule in DECISION_RULES.items():
            verdicts = rule(counts)
            action = actions(counts, verdicts, floor)
            look, decided = first_decision(action)
            right = decided == scenario.correct
            requests = counts.canary_n[look[right]]
            rows[name] = {
                "power": float(right.mean()),
                "wrong": float((decided == wrong_action).mean()),
                "wrong_ci95": list(wilson_interval(int((decided == wrong_action).sum()), runs)),
                "median": float(np.median(requests)) if right.any() else math.nan,
                "mean": float(requests.mean()) if right.any() else math.nan,
                "at_floor": float((requests == first_allowed).mean()) if right.any() else 0.0,
            }
            if scenario.correct == PROMOTE:
                ok = verdicts.non_inferior & counts.enough(floor)[None, :, None]
                first = np.where(ok.any(axis=1), ok.argmax(axis=1), LOOKS - 1)
                rows[name]["median_to_first_non_inferior"] = dict(
                    zip(RATES, np.median(counts.canary_n[first], axis=0).tolist(), strict=True)
                )
            if rule is sequential_rule:
                replayed = replay(counts, action) if floor == POLICY.min_requests else 0
                rows[name]["replayed_looks"] = replayed
        for baseline, key in (("bonferroni", "ratio"), ("bonf. score", "ratio_score")):
            rows[key] = {
                stat: rows["sequential"][stat] / rows[baseline][stat] for stat in ("median", "mean")
            }
        rows["floor_bound"] = all(
            rows[name]["median"] == first_allowed for name in ("sequential", "bonferroni")
        )
        results[scenario.name] = rows
    return results


def boundaries() -> dict[str, float]:
    """Each rule's z boundary for one rate, the mSPRT's at its best sample size (z**2 = r*
    + 1, :func:`registry.canary.tuned_mixture_scale`): why the rollback cannot be much
    faster than Bonferroni over 50 looks, and the promotion can."""
    from statistics import NormalDist

    def best(level: float) -> float:
        factor = float(tuned_mixture_scale(1.0, level)) ** 2  # r* / (1 + r*)
        return math.sqrt(1 / (1 - factor))

    inverse = NormalDist().inv_cdf
    return {
        "sequential worse (alpha/9)": best(POLICY.worse_alpha),
        "sequential non-inferior (alpha)": best(POLICY.non_inferior_alpha),
        "bonferroni, either (alpha/400)": inverse(1 - POLICY.alpha / (LOOKS * len(RATES))),
        "fixed-sample worse (alpha/9)": inverse(1 - POLICY.worse_alpha),
        "fixed-sample non-inferior (alpha)": inverse(1 - POLICY.non_inferior_alpha),
    }


def _print_samples(floor: int, block: dict[str, Any]) -> None:
    print(f"\n(b) canary requests to a correct decision, deciding from {floor} per arm")
    print(
        f"{'scenario':<34} {'rule':<11} {'power':>6} {'wrong':>6} {'median':>7} {'mean':>7} "
        f"{'at floor':>8}"
    )
    for name, rows in block.items():
        for rule in DECISION_RULES:
            row = rows[rule]
            print(
                f"{name:<34} {rule:<11} {row['power']:>6.3f} {row['wrong']:>6.4f} "
                f"{row['median']:>7.0f} {row['mean']:>7.0f} {row['at_floor']:>8.2f}"
            )
        ratio, score = rows["ratio"], rows["ratio_score"]
        bound = (
            f"  FLOOR-BOUND (both medians at the floor, {rows['floor_requests']})"
            if rows["floor_bound"]
            else ""
        )
        print(
            f"{'':<34} sequential/bonferroni median {ratio['median']:.3f} mean "
            f"{ratio['mean']:.3f}; /bonf. score median {score['median']:.3f} mean "
            f"{score['mean']:.3f}{bound}"
        )


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
    # Where the 200-request floor binds, every rule decides at it; from the demo's floor
    # (where the sequential rule's type I error is still under alpha, part a) the tests do.
    samples_low_floor = samples_to_decision(args.runs, rng, DEMO_FLOOR)
    elapsed = time.perf_counter() - started

    print(
        f"{args.runs} runs per scenario, {LOOKS} looks, alpha {POLICY.alpha}, "
        f"{POLICY.min_requests} requests per arm before deciding, seed {args.seed}"
    )
    print(f"\n(a) type I error over {LOOKS} looks (strict: ever, whether or not it stopped)")
    print(f"{'scenario':<30} {'event':<32} {'rule':<11} {'share':>7}  95% interval")
    for row in errors:
        low, high = row["ci95"]
        print(
            f"{row['scenario']:<30} {row['event']:<32} {row['rule']:<11} "
            f"{row['share']:>7.4f}  [{low:.4f}, {high:.4f}]"
        )
    for floor, block in ((POLICY.min_requests, samples), (DEMO_FLOOR, samples_low_floor)):
        _print_samples(floor, block)
    fine = samples["fine: equal rates"]
    print("  fine canary, median canary requests to each rate's first non-inferior verdict:")
    for rule in DECISION_RULES:
        firsts = fine[rule]["median_to_first_non_inferior"]
        print(f"    {rule:<11} " + ", ".join(f"{r} {n:.0f}" for r, n in firsts.items()))
    bounds = boundaries()
    print("\none rate's z boundary (the mSPRT's at its best sample size):")
    print("  " + ", ".join(f"{name} {z:.2f}" for name, z in bounds.items()))
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
                    "boundaries": bounds,
                    "seconds": elapsed,
                },
                indent=2,
            ),
            encoding="utf-8",
        )


if __name__ == "__main__":
    main()
