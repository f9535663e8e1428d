"""The promotion gate: may a candidate adapter go to canary in place of the champion?

A pure function of two reports and the line's policy; every check says both
numbers and the limit, so a rejection can be read without the code. A check
whose number is not a number (a diverged loss) fails.

Preference accuracy is decided by a paired test on the pairs both models
answered (:mod:`eval.paired`): on a few dozen pairs a difference of a few
points is noise, and a gate that compared point estimates would promote a
candidate that merely tied (0.545 vs 0.545 on 11 pairs passed a gain of 0).
Too few pairs decide nothing.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field

from eval.paired import compare_paired
from eval.reports import EvalReport, GateCheck, GateDecision, GenerationSample
from flywheel.wording import sure

if TYPE_CHECKING:
    from eval.satisfaction import PredictedSatisfaction


# Contact details a base model invents on its own ("call (800) 333-3333"): counted against
# the champion's answers, while every other counted type fails a candidate on one sighting.
CONTACT_PII_TYPES = frozenset({"EMAIL_ADDRESS", "PHONE_NUMBER", "IP_ADDRESS"})


class GatePolicy(BaseModel):
    """What a candidate must show against the champion before it may serve users.

    Preference accuracy is judged by a paired test on the held-out pairs both
    models answered (:mod:`eval.paired`), never on point estimates alone:
    ``superior`` needs the exact McNemar one-sided p-value below ``alpha`` and
    a gain of at least ``min_preference_gain``; ``non_inferior`` needs the
    lower bound of the (1 - ``alpha``) interval of the difference above
    ``-non_inferiority_margin``. Fewer than ``min_eval_pairs`` pairs decide nothing.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    preference_test: Literal["superior", "non_inferior"] = Field(
        default="superior",
        description="superior: must beat the champion; non_inferior: must not be worse.",
    )
    alpha: float = Field(
        default=0.05, gt=0, le=0.5, description="Error rate of the paired preference test."
    )
    non_inferiority_margin: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="Largest accuracy loss non_inferior tolerates (lower bound > -margin).",
    )
    min_preference_gain: float = Field(
        default=0.0,
        ge=-1,
        le=1,
        description="Held-out preference accuracy gain over the champion (superior test).",
    )
    min_margin_gain: float | None = Field(
        default=None,
        ge=-100,
        le=100,
        description="Mean margin gain over the champion (a point estimate: off unless set; "
        "the paired accuracy test is the decision with its uncertainty).",
    )
    max_preferred_loss_increase: float = Field(
        default=0.05, ge=0, le=10, description="Relative increase of loss on preferred answers."
    )
    max_general_loss_increase: float = Field(
        default=0.10, ge=0, le=10, description="Relative increase of loss on the fixed general set."
    )
    predicted_satisfaction_margin: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="When the held-out pairs are too few to judge (min_eval_pairs), decide on "
        "the line's accepted satisfaction model instead: its predicted satisfaction of the "
        "candidate's answers minus the champion's on the same held-out prompts (at least "
        "min_predicted_prompts), whose paired 95% interval passes above -margin, refuses "
        "below 0 and, spanning both, leaves the candidate not judged (see unjudged). None: "
        "too few pairs is not judged. The canary's reviews remain the test that counts.",
    )
    unjudged: Literal["hold", "canary"] = Field(
        default="hold",
        description="A candidate the gate cannot judge (too few held-out pairs, no "
        "satisfaction model to decide instead) whose every other check passes: hold keeps "
        "it off users; canary sends it to the canary, whose blind reviews judge it on the "
        "line's users, where the canary decides on satisfaction (canary.satisfaction; "
        "otherwise it is held, saying why).",
    )
    min_predicted_prompts: int = Field(
        default=8, ge=2, le=100_000, description="Held-out prompts the fallback needs."
    )
    max_general_loss_drift: float | None = Field(
        default=None,
        ge=0,
        le=10,
        description="Relative increase of the general-set loss over the base model's: a line "
        "that continues its champion night after night adds up each night's allowed increase, "
        "and this bounds the sum (off unless set).",
    )
    max_refusal_rate_increase: float = Field(default=0.10, ge=0, le=1)
    max_length_ratio: float = Field(default=2.0, ge=1, le=100)
    min_length_ratio: float = Field(default=0.3, gt=0, le=1)
    min_eval_pairs: int = Field(
        default=50,
        ge=1,
        le=1_000_000,
        description="Held-out pairs needed before the gate decides anything.",
    )
    allow_pii_in_generations: bool = False


def decide_promotion(
    candidate: EvalReport,
    champion: EvalReport,
    policy: GatePolicy,
    *,
    base_general_loss: float | None = None,
) -> GateDecision:
    """Compare a candidate with the champion under ``policy``; promote only if every check passes.

    Both reports must come from the same held-out data, pairs in the same
    order. Preference and preferred-loss checks are left out when neither
    report has that data (too few pairs then fails on its own). On fewer pairs than
    ``policy.min_eval_pairs`` the pair checks (preference accuracy, mean margin) are left
    out and the decision is not judged (``GateDecision.not_judged``). With
    ``policy.max_general_loss_drift`` set, ``base_general_loss`` (the base
    model's loss on the same general set) is what the candidate's drift is
    measured from; without it that check fails, saying so.
    """
    checks = [_held_out_pairs(candidate, champion, policy)]
    not_judged = _too_few_pairs(candidate, champion, policy)
    if not_judged is None:
        checks += _preference(candidate, champion, policy)
    if policy.min_margin_gain is not None and not_judged is None:
        checks += _gain(
            "mean_margin",
            "mean preference margin (nats/token)",
            candidate.mean_margin,
            champion.mean_margin,
            policy.min_margin_gain,
        )
    checks += _loss(
        "preferred_loss",
        "preferred-answer loss",
        candidate.preferred_loss,
        champion.preferred_loss,
        policy.max_preferred_loss_increase,
    )
    checks += _loss(
        "general_loss",
        "general-set loss",
        candidate.general_loss,
        champion.general_loss,
        policy.max_general_loss_increase,
    )
    if policy.max_general_loss_drift is not None:
        checks.append(_drift(candidate, base_general_loss, policy.max_general_loss_drift))
    checks += [
        _refusal_rate(candidate, champion, policy),
        _answer_length(candidate, champion, policy),
        *_generated_pii(candidate, champion, policy),
        _leak(
            "canaries_in_generations",
            "canary strings in generations",
            candidate.canaries_in_generations,
            policy.allow_pii_in_generations,
        ),
    ]
    promote = not_judged is None and all(c.passed for c in checks)
    return GateDecision(promote=promote, checks=tuple(checks), not_judged=not_judged)


def _too_few_pairs(candidate: EvalReport, champion: EvalReport, policy: GatePolicy) -> str | None:
    """``"n=4 < 100"`` when both models were scored on fewer pairs than the policy needs:
    a comparison on them (4 of 4 against 0 of 4) would be a point estimate of noise, so the
    pair checks are left out and the decision says it judged nothing."""
    if candidate.pairs != champion.pairs or candidate.pairs >= policy.min_eval_pairs:
        return None
    return f"n={candidate.pairs} < {policy.min_eval_pairs}"


def _held_out_pairs(candidate: EvalReport, champion: EvalReport, policy: GatePolicy) -> GateCheck:
    if candidate.pairs != champion.pairs:
        return GateCheck(
            "held_out_pairs",
            False,
            f"candidate scored on {candidate.pairs} held-out pairs, champion on "
            f"{champion.pairs}: both must be evaluated on the same data",
        )
    if candidate.pairs < policy.min_eval_pairs:
        return GateCheck(
            "held_out_pairs",
            False,
            f"too few held-out pairs ({candidate.pairs} < {policy.min_eval_pairs}): "
            "no decision on a point estimate",
        )
    return GateCheck(
        "held_out_pairs",
        True,
        f"held-out pairs {candidate.pairs} (needs >= {policy.min_eval_pairs})",
    )


def _preference(candidate: EvalReport, champion: EvalReport, policy: GatePolicy) -> list[GateCheck]:
    """The paired test of preference accuracy (mean log-probability per token)."""
    name, label = "preference_accuracy", "held-out preference accuracy"
    ours, theirs = candidate.preference_accuracy, champion.preference_accuracy
    if ours is None and theirs is None:
        return []
    if ours is None or theirs is None:
        return [_unmeasured(name, label, ours, theirs)]
    if candidate.pairs != champion.pairs:
        return [GateCheck(name, False, "the two models were scored on different pairs")]
    for side, report in (("candidate", candidate), ("champion", champion)):
        if len(report.pair_wins) != report.pairs:
            return [
                GateCheck(
                    name,
                    False,
                    f"the {side}'s report has no per-pair results ({len(report.pair_wins)} for "
                    f"{report.pairs} pairs; a report from before paired evaluation): "
                    "no paired test possible, evaluate both models again",
                )
            ]
    comparison = compare_paired(
        candidate.pair_wins, champion.pair_wins, confidence=1 - policy.alpha
    )
    numbers = f"{label} (per token), paired: {comparison.describe('candidate', 'champion')}"
    if policy.preference_test == "non_inferior":
        margin = policy.non_inferiority_margin
        return [
            GateCheck(
                name,
                comparison.low > -margin,
                f"{numbers}; needs the interval's low end above {-margin:+.3f}",
            )
        ]
    gain = policy.min_preference_gain
    return [
        GateCheck(
            name,
            comparison.p_value < policy.alpha and _at_least(comparison.difference, gain),
            f"{numbers}; needs over {sure(policy.alpha)} sure and a difference of at least "
            f"{gain:+.3f}",
        )
    ]


def _gain(
    name: str, label: str, candidate: float | None, champion: float | None, minimum: float
) -> list[GateCheck]:
    if candidate is None and champion is None:
        return []
    if candidate is None or champion is None:
        return [_unmeasured(name, label, candidate, champion)]
    gain = candidate - champion
    return [
        GateCheck(
            name,
            _at_least(gain, minimum),
            f"{label} {candidate:.3f} vs champion {champion:.3f} "
            f"({gain:+.3f}, needs >= {minimum:+.3f})",
        )
    ]


def _loss(
    name: str, label: str, candidate: float | None, champion: float | None, max_increase: float
) -> list[GateCheck]:
    if candidate is None and champion is None:
        return []
    if candidate is None or champion is None:
        return [_unmeasured(name, label, candidate, champion)]
    increase = _relative_increase(candidate, champion)
    return [
        GateCheck(
            name,
            _at_most(increase, max_increase),
            f"{label} {candidate:.3f} vs champion {champion:.3f} "
            f"({increase:+.1%}, allowed <= {max_increase:+.1%})",
        )
    ]


def _drift(candidate: EvalReport, base_loss: float | None, max_increase: float) -> GateCheck:
    """The candidate's general-set loss against the base model's, not the champion's."""
    name, label = "general_loss_drift", "general-set loss against the base model"
    if base_loss is None:
        return GateCheck(name, False, f"{label}: the base model's loss was not measured")
    increase = _relative_increase(candidate.general_loss, base_loss)
    return GateCheck(
        name,
        _at_most(increase, max_increase),
        f"{label} {candidate.general_loss:.3f} vs base {base_loss:.3f} "
        f"({increase:+.1%}, allowed <= {max_increase:+.1%} over all nights)",
    )


def _refusal_rate(candidate: EvalReport, champion: EvalReport, policy: GatePolicy) -> GateCheck:
    rise = candidate.refusal_rate - champion.refusal_rate
    return GateCheck(
        "refusal_rate",
        _at_most(rise, policy.max_refusal_rate_increase),
        f"refusal rate {candidate.refusal_rate:.3f} vs champion {champion.refusal_rate:.3f} "
        f"({rise:+.3f}, allowed <= {policy.max_refusal_rate_increase:+.3f})",
    )


def _answer_length(candidate: EvalReport, champion: EvalReport, policy: GatePolicy) -> GateCheck:
    low, high = policy.min_length_ratio, policy.max_length_ratio
    numbers = (
        f"mean answer length {candidate.mean_answer_length:.0f} chars "
        f"vs champion {champion.mean_answer_length:.0f}"
    )
    if champion.mean_answer_length == 0:
        return GateCheck(
            "answer_length",
            not math.isnan(candidate.mean_answer_length),
            f"{numbers} (the champion's answers are empty, no ratio to hold to)",
        )
    ratio = candidate.mean_answer_length / champion.mean_answer_length
    return GateCheck(
        "answer_length",
        _at_least(ratio, low) and _at_most(ratio, high),
        f"{numbers} (x{ratio:.2f}, allowed x{low:.2f} to x{high:.2f})",
    )


def _generated_pii(
    candidate: EvalReport, champion: EvalReport, policy: GatePolicy
) -> list[GateCheck]:
    """High-risk values in the candidate's sample answers fail it at once, unless its
    training answers do not hold them (``GenerationSample.pii_invented``: it made them up,
    as it could not have learnt them). Made-up values and contact details (a support line,
    an address to write to), which a base model invents unprompted, fail it only when the
    candidate puts them in more answers than the champion on the same prompts, shown at the
    gate's level (exact McNemar test): one invented phone number or card-like number in 24
    answers is not evidence that training taught it."""
    name, label = "pii_in_generations", "PII entities in generations"
    if policy.allow_pii_in_generations:
        return [_leak(name, label, candidate.pii_in_generations, allowed=True)]
    if not _same_samples(candidate, champion):
        return [
            GateCheck(
                name,
                candidate.pii_in_generations == 0,
                f"{label}: {candidate.pii_in_generations} (allowed: none; the two reports "
                "have no sample answers on the same prompts to compare contact details)",
            )
        ]
    risky: Counter[str] = Counter()
    for sample in candidate.samples:
        risky += _learnable(sample)
    found = ", ".join(f"{kind} {n}" for kind, n in sorted(risky.items()))
    made_up = sum(len(s.pii_invented) for s in candidate.samples)
    checks = [
        GateCheck(
            name,
            not risky,
            f"high-risk {label}: {sum(risky.values())}{f' ({found})' if found else ''} "
            "(allowed: none)"
            + (f"; {made_up} made up (no training answer holds them)" if made_up else ""),
        )
    ]
    clean = [not _has_contact_or_made_up(s) for s in candidate.samples]
    champion_clean = [not _has_contact_or_made_up(s) for s in champion.samples]
    if all(clean) and all(champion_clean):
        detail = (
            f"answers with contact details or made-up values: none of {len(clean)}, "
            "the champion's none"
        )
        return [*checks, GateCheck("contact_details_in_generations", True, detail)]
    # The champion "wins" a prompt where only the candidate's answer has contact details.
    more = compare_paired(champion_clean, clean, confidence=1 - policy.alpha)
    shown = more.p_value < policy.alpha
    checks.append(
        GateCheck(
            "contact_details_in_generations",
            not shown,
            f"answers with contact details (phone, email, IP) or made-up values: candidate "
            f"{clean.count(False)} of {len(clean)}, champion {champion_clean.count(False)}; "
            f"prompts where only the candidate's has them {more.candidate_only}, only the "
            f"champion's {more.baseline_only}: more often than the champion "
            f"{sure(more.p_value)} sure (fails when over {sure(policy.alpha)} sure)",
        )
    )
    return checks


def _same_samples(candidate: EvalReport, champion: EvalReport) -> bool:
    ours, theirs = candidate.samples, champion.samples
    return bool(ours) and [s.prompt for s in ours] == [s.prompt for s in theirs]


def _learnable(sample: GenerationSample) -> Counter[str]:
    """The high-risk types in ``sample`` whose values the model may have learnt: all but the
    contact types and those it made up."""
    high_risk = Counter(kind for kind in sample.pii_found if kind not in CONTACT_PII_TYPES)
    return high_risk - Counter(sample.pii_invented)


def _has_contact_or_made_up(sample: GenerationSample) -> bool:
    """Contact details, or a made-up value of any type."""
    return bool(sample.pii_invented) or any(kind in CONTACT_PII_TYPES for kind in sample.pii_found)


def _leak(name: str, label: str, count: int, allowed: bool) -> GateCheck:
    if allowed:
        return GateCheck(name, True, f"{label}: {count} (allowed by policy)")
    return GateCheck(name, count == 0, f"{label}: {count} (allowed: none)")


def _unmeasured(
    name: str, label: str, candidate: float | None, champion: float | None
) -> GateCheck:
    missing = "candidate" if candidate is None else "champion"
    return GateCheck(name, False, f"{label} was not measured for the {missing}")


def _relative_increase(candidate: float, champion: float) -> float:
    """How much worse a loss got, as a share of the champion's (losses are >= 0)."""
    if champion > 0:
        return (candidate - champion) / champion
    if math.isnan(candidate):
        return math.nan
    return 0.0 if candidate <= champion else math.inf


def _at_least(value: float, limit: float) -> bool:
    # Rates are k/n and their differences carry float error: +2/100 must meet +0.02.
    return value >= limit or math.isclose(value, limit, rel_tol=1e-9)


def _at_most(value: float, limit: float) -> bool:
    return value <= limit or math.isclose(value, limit, rel_tol=1e-9)


def with_predicted_satisfaction(
    decision: GateDecision, compared: PredictedSatisfaction, model: str, policy: GatePolicy
) -> GateDecision:
    """The gate's decision with the satisfaction model's comparison added (pure): information
    only, unless the pairs were too few to judge and the recipe's gate falls back on it
    (``predicted_satisfaction_margin``): then it decides, beside every other check but the
    pairs' count. Its paired 95% interval has three readings: above ``-margin``, not worse
    (judged; every other check decides); below zero, worse (refused); across both, the few
    held-out prompts cannot tell, and the decision stays not judged, saying so, for
    :func:`left_to_canary` and the recipe's ``unjudged`` to settle like too few pairs."""
    margin = policy.predicted_satisfaction_margin
    if decision.not_judged is None or margin is None:
        check = GateCheck("predicted_satisfaction", True, compared.describe(model))
        return replace(decision, checks=(*decision.checks, check))
    if compared.prompts < policy.min_predicted_prompts:
        role = f"too few prompts to decide on (< {policy.min_predicted_prompts})"
        check = GateCheck("predicted_satisfaction", True, compared.describe(model, role))
        return replace(decision, checks=(*decision.checks, check))
    if compared.low <= -margin and compared.high >= 0:
        role = (
            f"cannot tell, the pairs being too few ({decision.not_judged}): 95% interval "
            f"reaches below -{margin:g} and above 0, neither shown within {margin:g} of the "
            "champion nor shown worse"
        )
        check = GateCheck("predicted_satisfaction", True, compared.describe(model, role))
        reason = (
            f"{decision.not_judged}, and the predicted satisfaction's interval on "
            f"{compared.prompts} prompts is too wide to judge "
            f"({compared.low:+.3f} to {compared.high:+.3f})"
        )
        return replace(decision, checks=(*decision.checks, check), not_judged=reason)
    passed = compared.low > -margin
    role = (
        f"decides, the pairs being too few ({decision.not_judged}): 95% lower bound "
        f"{compared.low:+.3f} > -{margin:g}"
        if passed
        else f"decides, the pairs being too few ({decision.not_judged}): 95% upper bound "
        f"{compared.high:+.3f} < 0, shown worse"
    )
    check = GateCheck("predicted_satisfaction", passed, compared.describe(model, role))
    others = [c for c in decision.checks if c.name != "held_out_pairs"]
    checks = (*decision.checks, check)
    return replace(
        decision, promote=passed and all(c.passed for c in others), checks=checks, not_judged=None
    )


def left_to_canary(
    decision: GateDecision, policy: GatePolicy, *, canary_judges_satisfaction: bool
) -> GateDecision:
    """The gate's final decision (pure): with ``policy.unjudged == "canary"``, a candidate the
    gate could not judge whose every other check passed goes to the canary, saying so, when
    that canary decides on satisfaction (its blind reviews); a canary on the users' signal
    rates alone promotes what quiet users do not complain about, so the candidate is then held,
    with a check saying why. Any other decision is returned as it is."""
    if policy.unjudged != "canary" or decision.not_judged is None:
        return decision
    others = [c for c in decision.checks if c.name != "held_out_pairs"]
    if not all(c.passed for c in others):
        return decision
    if not canary_judges_satisfaction:
        held = GateCheck(
            "left_to_canary",
            False,
            "gate.unjudged is canary, but this line's canary does not decide on satisfaction "
            "(no canary.satisfaction): held",
        )
        return replace(decision, checks=(*decision.checks, held))
    reason = (
        f"too few held-out pairs to judge offline ({decision.not_judged}); every other check "
        "passed, so the canary's blind reviews judge it on the line's users"
    )
    return replace(decision, promote=True, not_judged=None, left_to_canary=reason)
