"""The canary on every answer (satisfaction by PPI) against today's feedback-only rule.

Run from the repository root::

    .venv/bin/python lab/bench/canary_ppi_bench.py [--runs 300] [--seed 0] [--json out.json]

Simulated canaries on a true 5% share (the champion answers 19 users for each
of the canary's). Each user is satisfied or not (the arm's satisfaction); users
voice it at the realistic feedback profile's rates
(``simulation.feedback_profiles``: about nine answers in ten silent); reviewers
judge a random sample of each arm's answers blind to the arm (the review
queue's default shares: 20% of the canary's, 2% of the champion's), getting 10%
of verdicts wrong; a satisfaction model scores every answer with a given AUC
(a score whose log-odds are a normal shift apart on satisfied and unsatisfied
answers), optionally fooled by the canary's style (its scores shifted up).

The rules, both the product's ``registry.canary`` statistics at alpha 0.05 over
the same 50 looks (canary users 100 to 20,000, spaced geometrically), floor 200
requests per arm:

* **feedback only**: ``CanaryPolicy()`` as today, the eight signal rates
  (thumbs-down, regenerate, edit, error, abandon, task failure, dissatisfied,
  refusal) with their margins; promote when every rate is non-inferior;
* **PPI**: ``CanaryPolicy(satisfaction=SatisfactionTest())``: satisfaction per
  arm (the model's scores rectified by the reviews, PPI++), margin 0.05 on
  the reviewers' scale, 30 reviews per arm first; the rates as guardrails.
* **PPI, 1/10 share**: the same, satisfaction holding a tenth of the rollback
  budget (an equal share with the nine guardrails) instead of the default half;
* **reviews only** (a reference): the same test with the model's weight at 0.

Printed per scenario: the share promoted, rolled back and undecided by the last
look, and the canary users to a correct decision (median over the runs decided
correctly). Type I errors: equal arms rolled back; a canary worse by exactly
the margin promoted. Then the PPI rule on a canary worse by 0.15 across model
AUCs and review shares.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import dataclass, replace
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np

from feedback.events import ONLINE_SIGNALS, Signal
from lab.simulation.feedback_profiles import PROFILES, SIGNALS
from registry.canary import (
    RATES,
    WORSE_DESIGN_EFFECT,
    CanaryPolicy,
    SatisfactionTest,
    rollback_evidence,
    satisfaction_evidence,
    sequential_evidence,
)
from registry.ppi import estimate_arrays, informed_scores, user_signal_pull

LOOKS = 50
CANARY_USERS = np.unique(np.round(np.geomspace(100, 20_000, LOOKS)).astype(int))
CHAMPION_RATIO = 19  # a 5% canary share
FLOOR = 200
NOISE = 0.1  # reviewers' wrong verdicts
# Rates the users' satisfaction does not drive, equal on both arms.
ERROR_RATE, REFUSAL_RATE = 0.002, 0.01
NEGATIVE = tuple(signal.value for signal in ONLINE_SIGNALS)
CHUNK = 400_000  # answers drawn at once (memory)
# What scores an arm's answers for PPI: the model alone, the model with the user's own signal
# folded in (registry.ppi.informed_scores, as the canary does), the users' signals alone (a
# night without an accepted model).
SCORERS = ("model", "model + signals", "signals")
# Each drawn signal's pull and direction, indexed by SIGNALS' position; the last entry (index
# -1) is silence.
PULL = np.array([*(user_signal_pull(Signal(name))[0] for name in SIGNALS), 0.0])
TOWARDS = np.array([*(user_signal_pull(Signal(name))[1] for name in SIGNALS), 0.0])


@dataclass(frozen=True)
class World:
    """How one simulated canary's users, reviewers and model behave."""

    champion: float
    canary: float
    auc: float = 0.85
    canary_review_share: float = 0.2
    champion_review_share: float = 0.02
    canary_score_bias: float = 0.0  # added to the model's log-odds on canary answers
    profile: str = "realistic"  # the users' feedback profile (lab.simulation.feedback_profiles)


@dataclass
class ArmSums:
    """One arm's running sums, per run."""

    n: np.ndarray
    rates: np.ndarray  # (runs, len(RATES))
    # Per scorer, (runs, 8): registry.ppi.estimate_arrays' sums, in order.
    ppi: dict[str, np.ndarray]

    @classmethod
    def empty(cls, runs: int) -> ArmSums:
        ppi = {scorer: np.zeros((runs, 8)) for scorer in SCORERS}
        return cls(np.zeros(runs), np.zeros((runs, len(RATES))), ppi)


def _draw(
    rng: np.random.Generator, runs: int, count: int, satisfaction: float, review_share: float,
    auc: float, bias: float, profile_name: str,
) -> tuple[np.ndarray, dict[str, np.ndarray]]:  # fmt: skip
    """``count`` new answers per run: (rate counts, PPI sums), each summed over the answers."""
    profile = PROFILES[profile_name]
    shift = math.sqrt(2) * NormalDist().inv_cdf(auc)
    rates = np.zeros((runs, len(RATES)))
    sums = {scorer: np.zeros((runs, 8)) for scorer in SCORERS}
    per_chunk = max(1, CHUNK // runs)
    left = count
    while left > 0:
        k = min(left, per_chunk)
        left -= k
        satisfied = rng.random((runs, k)) < satisfaction
        uniform = rng.random((runs, k))
        signal = np.full((runs, k), -1)
        for happy in (True, False):
            start = np.zeros((runs, k))
            for index, name in enumerate(SIGNALS):
                p = profile.rates(happy).get(name, 0.0)
                hit = (satisfied == happy) & (uniform >= start) & (uniform < start + p)
                signal[hit] = index
                start = start + p
        for column, name in enumerate(RATES):
            if name in NEGATIVE:
                rates[:, column] += (signal == SIGNALS.index(name)).sum(axis=1)
        negative = np.isin(signal, [SIGNALS.index(n) for n in NEGATIVE])
        rates[:, RATES.index("dissatisfied")] += negative.sum(axis=1)
        rates[:, RATES.index("error")] += rng.binomial(k, ERROR_RATE, runs)
        rates[:, RATES.index("refusal")] += rng.binomial(k, REFUSAL_RATE, runs)
        latent = rng.standard_normal((runs, k)) + shift * satisfied
        score = 1 / (1 + np.exp(-(shift * latent - shift**2 / 2 + bias)))
        reviewed = rng.random((runs, k)) < review_share
        verdict = np.where(rng.random((runs, k)) < NOISE, ~satisfied, satisfied).astype(float)
        pull, towards = PULL[signal], TOWARDS[signal]
        for scorer, values in (
            ("model", score),
            ("model + signals", informed_scores(score, pull, towards)),
            ("signals", informed_scores(np.zeros_like(score), pull, towards)),
        ):
            sums[scorer] += _ppi_sums(values, verdict, reviewed)
    return rates, sums


def _ppi_sums(score: np.ndarray, verdict: np.ndarray, reviewed: np.ndarray) -> np.ndarray:
    """registry.ppi.estimate_arrays' eight sums of one chunk, per run."""
    unreviewed = ~reviewed
    return np.stack(
        [
            unreviewed.sum(axis=1),
            (score * unreviewed).sum(axis=1),
            (score**2 * unreviewed).sum(axis=1),
            reviewed.sum(axis=1),
            (verdict * reviewed).sum(axis=1),
            (score * reviewed).sum(axis=1),
            (score**2 * reviewed).sum(axis=1),
            (verdict * score * reviewed).sum(axis=1),
        ],
        axis=1,
    )


def simulate(world: World, runs: int, rng: np.random.Generator) -> list[tuple[ArmSums, ArmSums]]:
    """Each look's cumulative sums of both arms."""
    champion, canary = ArmSums.empty(runs), ArmSums.empty(runs)
    looks = []
    previous = 0
    for users in CANARY_USERS:
        new = int(users - previous)
        previous = int(users)
        for arm, satisfaction, ratio, share, bias in (
            (canary, world.canary, 1, world.canary_review_share, world.canary_score_bias),
            (champion, world.champion, CHAMPION_RATIO, world.champion_review_share, 0.0),
        ):
            rates, sums = _draw(
                rng, runs, new * ratio, satisfaction, share, world.auc, bias, world.profile
            )
            arm.n = arm.n + new * ratio
            arm.rates = arm.rates + rates
            arm.ppi = {scorer: arm.ppi[scorer] + sums[scorer] for scorer in SCORERS}
        looks.append((replace(champion), replace(canary)))
    return looks


def feedback_actions(looks: list[tuple[ArmSums, ArmSums]], policy: CanaryPolicy) -> np.ndarray:
    """Today's rule at every look: 1 promote, -1 roll back, 0 wait (runs, looks)."""
    margins = np.array([policy.margin(name) for name in RATES])
    out = []
    for champion, canary in looks:
        worse_e, non_inferior_e = sequential_evidence(
            champion.rates, champion.n[:, None], canary.rates, canary.n[:, None], margins,
            worse_alpha=policy.worse_alpha, non_inferior_alpha=policy.non_inferior_alpha,
        )  # fmt: skip
        # The output length's test is not simulated: rollback_evidence counts it as 1.
        rollback = rollback_evidence(policy, worse_e) >= 1 / policy.alpha
        rollback |= (worse_e >= 1 / policy.worse_alpha).any(axis=1)
        promote = (non_inferior_e >= 1 / policy.non_inferior_alpha).all(axis=1)
        out.append(np.where(rollback, -1, np.where(promote, 1, 0)))
    return _gate_floor(np.stack(out, axis=1), looks)


def ppi_actions(
    looks: list[tuple[ArmSums, ArmSums]], policy: CanaryPolicy, *, scorer: str | None = "model"
) -> np.ndarray:
    """The PPI rule at every look: satisfaction decides, the rates roll back as guardrails."""
    test = policy.satisfaction
    assert test is not None
    out = []
    for champion, canary in looks:
        worse_e, _ = sequential_evidence(
            champion.rates, champion.n[:, None], canary.rates, canary.n[:, None],
            np.array([policy.margin(name) for name in RATES]),
            worse_alpha=policy.worse_alpha, non_inferior_alpha=policy.non_inferior_alpha,
        )  # fmt: skip
        arms = []
        for arm in (champion, canary):
            sums = arm.ppi[scorer or "model"].T.copy()
            if scorer is None:  # reviews only: every answer's score is 0, so the model weighs 0
                sums[[1, 2, 5, 6, 7]] = 0.0
            arms.append(estimate_arrays(*sums, power_tuned=test.power_tuned))
        difference = arms[1][0] - arms[0][0]
        variance = arms[1][1] + arms[0][1]
        sat_worse, sat_ok = satisfaction_evidence(
            difference, variance, test.margin,
            worse_alpha=policy.satisfaction_worse_alpha,
            non_inferior_alpha=policy.non_inferior_alpha,
        )  # fmt: skip
        reviews = (champion.ppi["model"][:, 3], canary.ppi["model"][:, 3])
        enough = np.minimum(*reviews) >= test.min_reviews
        sat_worse = np.where(enough, sat_worse, 1.0)
        sat_ok = np.where(enough, sat_ok, 0.0)
        rollback = rollback_evidence(policy, worse_e, sat_worse) >= 1 / policy.alpha
        rollback |= (worse_e >= 1 / policy.worse_alpha).any(axis=1)
        rollback |= sat_worse >= 1 / policy.satisfaction_worse_alpha
        promote = sat_ok >= 1 / policy.non_inferior_alpha
        out.append(np.where(rollback, -1, np.where(promote, 1, 0)))
    return _gate_floor(np.stack(out, axis=1), looks)


def _gate_floor(action: np.ndarray, looks: list[tuple[ArmSums, ArmSums]]) -> np.ndarray:
    canary_n = np.array([canary.n[0] for _, canary in looks])
    return np.where(canary_n[None, :] >= FLOOR, action, 0)


def outcome(action: np.ndarray, correct: int) -> dict[str, Any]:
    """Shares promoted / rolled back / undecided at the first decision, and the canary users
    to a correct one."""
    decided = (action != 0).any(axis=1)
    first = np.argmax(action != 0, axis=1)
    chosen = np.where(decided, action[np.arange(len(action)), first], 0)
    right = chosen == correct
    users = CANARY_USERS[first[right]] if right.any() else np.array([])
    # The canary users by which 90% of the runs have taken the correct decision: a rule that
    # decides wrongly in more than 10% of the runs never gets there.
    done = np.array([(right & (first <= look)).mean() for look in range(len(CANARY_USERS))])
    reached = np.flatnonzero(done >= 0.9)
    return {
        "users_90": int(CANARY_USERS[reached[0]]) if reached.size else None,
        "promoted": float((chosen == 1).mean()),
        "rolled_back": float((chosen == -1).mean()),
        "undecided": float((chosen == 0).mean()),
        "correct": float(right.mean()),
        "median_users": float(np.median(users)) if users.size else None,
        "mean_users": float(users.mean()) if users.size else None,
        "ever_promoted": float((action == 1).any(axis=1).mean()),
        "ever_rolled_back": float((action == -1).any(axis=1).mean()),
        "correct_by_look": [round(float(v), 4) for v in done],
    }


def _compare(
    results: dict[str, Any], names: tuple[str, ...], rules: tuple[str, str], key: str, says: str
) -> None:
    """Print and keep, per scenario, the canary users to 90% correct of one rule over
    another's (``says`` words it with ``{a}`` and ``{b}``)."""
    for name in names:
        block = results["scenarios"][name]
        a, b = (block[rule]["users_90"] for rule in rules)
        if a and b:
            print(f"{name}: {says.format(a=a, b=b)} ({a / b:.2f}x)")
            results.setdefault(key, {})[name] = a / b


def plot(results: dict[str, Any], path: Path) -> Path:
    """Share of runs decided correctly by canary users, per rule, for four scenarios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [
        "worse by 0.15 (0.50 -> 0.35)",
        "worse by 0.15, model fooled (+1 log-odds on canary)",
        "better by 0.15 (0.35 -> 0.50)",
        "equal (0.50 vs 0.50)",
    ]
    figure, axes = plt.subplots(1, len(names), figsize=(16, 4), sharey=True)
    for axis, name in zip(axes, names, strict=True):
        rules = (("PPI", "-"), ("PPI, 1/10 share", "-."), ("reviews only", "--"),
                 ("feedback only", ":"))  # fmt: skip
        for rule, style in rules:
            curve = results["scenarios"][name][rule]["correct_by_look"]
            axis.plot(CANARY_USERS, curve, style, label=rule)
        axis.set_xscale("log")
        axis.set_title(name, fontsize=9)
        axis.set_xlabel("canary users (5% share)")
        axis.axhline(0.9, color="grey", linewidth=0.5)
    axes[0].set_ylabel(f"share of {results['runs']} runs decided correctly")
    axes[0].legend(loc="upper left", fontsize=8)
    figure.suptitle("Canary at realistic feedback rates: satisfaction by PPI vs the users' signals")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="Write the curves here (PNG).")
    parser.add_argument(
        "--feedback", choices=sorted(PROFILES), default="realistic", help="The users' profile."
    )
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    feedback_policy = CanaryPolicy()
    ppi_policy = CanaryPolicy(satisfaction=SatisfactionTest())
    # Satisfaction holding an equal share of the rollback budget with the nine guardrails, as
    # before it held half: the same statistics, to measure what the share buys.
    equal_share = CanaryPolicy(
        satisfaction=SatisfactionTest(rollback_share=1 / ppi_policy.worse_tests)
    )
    margin = ppi_policy.satisfaction.margin if ppi_policy.satisfaction else 0.05
    # The reviewers' pass rate is 0.1 + 0.8 * satisfaction: a drop of the margin on their
    # scale is margin / 0.8 of satisfaction.
    at_margin = margin / (1 - 2 * NOISE)
    profile = args.feedback
    scenarios = {
        "equal (0.50 vs 0.50)": (World(0.5, 0.5, profile=profile), 1),
        "worse by the margin": (World(0.5, 0.5 - at_margin, profile=profile), -1),
        "worse by 0.15 (0.50 -> 0.35)": (World(0.5, 0.35, profile=profile), -1),
        "inverted (0.48 -> 0.12)": (World(0.48, 0.12, profile=profile), -1),
        "better by 0.15 (0.35 -> 0.50)": (World(0.35, 0.5, profile=profile), 1),
        "worse by 0.15, model fooled (+1 log-odds on canary)": (
            World(0.5, 0.35, canary_score_bias=1.0, profile=profile), -1,
        ),
    }  # fmt: skip
    started = time.monotonic()
    print(
        f"{args.runs} runs per scenario; {len(CANARY_USERS)} looks at {CANARY_USERS[0]}..."
        f"{CANARY_USERS[-1]} canary users (5% share: the champion x{CHAMPION_RATIO}); {profile} "
        f"feedback; reviews 20% canary / 2% champion, {NOISE:.0%} wrong; model AUC 0.85"
    )
    results: dict[str, Any] = {"runs": args.runs, "looks": CANARY_USERS.tolist(), "scenarios": {}}
    results["feedback"] = profile
    header = (
        f"{'scenario':52} {'rule':17} {'promote':>8} {'rollback':>8} {'undecided':>9} "
        f"{'users*':>8} {'users90':>8}"
    )
    print(header)
    for name, (world, correct) in scenarios.items():
        looks = simulate(world, args.runs, rng)
        block = {
            "feedback only": outcome(feedback_actions(looks, feedback_policy), correct),
            "PPI": outcome(ppi_actions(looks, ppi_policy), correct),
            "PPI + signals": outcome(
                ppi_actions(looks, ppi_policy, scorer="model + signals"), correct
            ),
            "signals + reviews": outcome(ppi_actions(looks, ppi_policy, scorer="signals"), correct),
            "PPI, 1/10 share": outcome(ppi_actions(looks, equal_share), correct),
            "reviews only": outcome(ppi_actions(looks, ppi_policy, scorer=None), correct),
        }
        results["scenarios"][name] = block
        for rule, res in block.items():
            users = f"{res['median_users']:.0f}" if res["median_users"] is not None else "-"
            users_90 = str(res["users_90"]) if res["users_90"] is not None else "never"
            print(
                f"{name[:52]:52} {rule:17} {res['promoted']:8.3f} {res['rolled_back']:8.3f} "
                f"{res['undecided']:9.3f} {users:>8} {users_90:>8}"
            )
    worse = results["scenarios"]["worse by 0.15 (0.50 -> 0.35)"]
    ppi_90, feedback_90 = worse["PPI"]["users_90"], worse["feedback only"]["users_90"]
    if ppi_90 and feedback_90:
        ratio = feedback_90 / ppi_90
        print(
            f"worse by 0.15: 90% correct after {feedback_90} canary users on feedback alone, "
            f"{ppi_90} with PPI ({ratio:.1f}x)"
        )
        results["worse_015_ratio"] = ratio
    else:
        print(
            f"worse by 0.15: 90% correct after {ppi_90 or 'never'} canary users with PPI; on "
            f"feedback alone {feedback_90 or 'never'} (it promoted "
            f"{worse['feedback only']['promoted']:.0%} of these canaries)"
        )
    _compare(
        results, ("worse by 0.15 (0.50 -> 0.35)", "inverted (0.48 -> 0.12)"),
        ("PPI", "PPI, 1/10 share"), "share_ratio",
        "satisfaction holding half the rollback budget decides 90% correctly after {a} canary "
        "users, a tenth of it after {b}",
    )  # fmt: skip
    _compare(
        results, tuple(results["scenarios"]), ("PPI", "PPI + signals"), "signals_ratio",
        "90% correct after {a} canary users with the model's scores, {b} with the users' "
        "signals folded in",
    )  # fmt: skip
    equal = results["scenarios"]["equal (0.50 vs 0.50)"]
    at = results["scenarios"]["worse by the margin"]
    print(
        f"type I over {len(CANARY_USERS)} looks (alpha {ppi_policy.alpha}): equal arms ever "
        f"rolled back PPI {equal['PPI']['ever_rolled_back']:.3f} (1/10 share "
        f"{equal['PPI, 1/10 share']['ever_rolled_back']:.3f}), feedback "
        f"{equal['feedback only']['ever_rolled_back']:.3f}; "
        f"worse by the margin ever promoted PPI {at['PPI']['ever_promoted']:.3f}, with signals "
        f"{at['PPI + signals']['ever_promoted']:.3f}, reviews only "
        f"{at['reviews only']['ever_promoted']:.3f}; equal arms ever rolled back with signals "
        f"{equal['PPI + signals']['ever_rolled_back']:.3f}"
    )
    print("\nPPI on a canary worse by 0.15, by the model's AUC and the canary's review share:")
    sweep: dict[str, Any] = {}
    print(
        f"{'AUC':>5} {'review share':>12} {'correct':>8} {'users90':>8} {'+ signals':>10} "
        f"{'reviews only':>13}"
    )
    for auc in (0.6, 0.75, 0.9):
        for share in (0.05, 0.1, 0.2):
            world = World(0.5, 0.35, auc=auc, canary_review_share=share, profile=profile)
            looks = simulate(world, max(args.runs // 2, 50), rng)
            res = outcome(ppi_actions(looks, ppi_policy), -1)
            informed = outcome(ppi_actions(looks, ppi_policy, scorer="model + signals"), -1)
            ref = outcome(ppi_actions(looks, ppi_policy, scorer=None), -1)
            sweep[f"auc={auc},share={share}"] = {
                "PPI": res, "PPI + signals": informed, "reviews only": ref,
            }  # fmt: skip
            print(
                f"{auc:5.2f} {share:12.2f} {res['correct']:8.3f} "
                f"{res['users_90'] or 'never':>8} {informed['users_90'] or 'never':>10} "
                f"{ref['users_90'] or 'never':>13}"
            )
    results["sweep"] = sweep
    results["design_effect"] = WORSE_DESIGN_EFFECT
    print(
        f"{time.monotonic() - started:.0f} s; users*: median canary users to a correct decision "
        "(of the runs decided correctly); users90: canary users by which 90% of runs decided "
        "correctly"
    )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    if args.plot:
        print(f"plot: {plot(results, args.plot)}")


if __name__ == "__main__":
    main()
