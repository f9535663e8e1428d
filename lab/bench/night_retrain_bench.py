"""One night of a ``flywheel loop`` run trained again by the nightly's own ``train_line``, under
the recipe as it is now: what the training kept (its loss guard's measures), the gate's verdict,
and the new adapter's answers to the loop's fresh prompts against the champion's, judged by the
simulated users.

    FLYWHEEL_HOME=<a loop's home> .venv/bin/python lab/bench/night_retrain_bench.py \\
        --line medical --dataset HASH [--prompts 100]

The home's champion is continued (or not) as the recipe says, on the night's dataset (its
hash, as the nightly's log names it) accumulated over the recipe's history, exactly as that
night's run trained; the version it registers is a new one in that home's registry. Answers
are greedy, so both models are judged on the same footing in the same run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def main(argv: Sequence[str] | None = None) -> int:
    """Train the night again, print the guard's measures, the gate and both models' shares."""
    from composition.clients import build_clients
    from composition.line_training import train_line
    from composition.recipes import packaged_recipes_dir
    from flywheel.settings import load_settings
    from lab.bench.positive_noise_bench import answers
    from lab.simulation.protocol import load_users
    from training.base_model import ensure_base_model

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", default="medical")
    parser.add_argument("--dataset", required=True, help="the night's dataset hash")
    parser.add_argument("--prompts", type=int, default=100)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--users", default="lab.simulation.users:BuiltinUsers")
    args = parser.parse_args(argv)

    settings = load_settings()
    if settings.recipes_dir is None:
        settings = settings.model_copy(update={"recipes_dir": packaged_recipes_dir() / "demo"})
    clients = build_clients(settings)
    registry = clients.registry
    champion = registry.alias_version(args.line, "champion")
    found = sorted((settings.datasets_dir / args.line).glob(f"{args.dataset}*"))
    if len(found) != 1:
        print(f"no single dataset {args.dataset} of {args.line}", file=sys.stderr)
        return 2
    outcome = train_line(settings, clients, args.line, force=True, dataset_hash=found[0].name)
    print(f"champion v{champion}; trained v{outcome.version}: {outcome.status}: {outcome.reason}")
    if outcome.run_id is not None:
        history = registry.client.get_metric_history(outcome.run_id, "guard/general_loss")
        measures = ", ".join(f"{m.step}: {m.value:.3f}" for m in history)
        print(f"guard measures (step: general-set loss): {measures}")
        if outcome.decision is not None:
            print(outcome.decision.summary)
            for reason in outcome.decision.reasons:
                print(f"  {reason}")
    if outcome.version is None:
        return 1
    users = load_users(args.users)
    prompts = users.prompts(args.line, args.prompts, 999_983)
    base_dir = ensure_base_model(settings.models_dir, settings.base_model)
    for name, version in (("champion", champion), ("retrained", outcome.version)):
        adapter = registry.adapter_path(args.line, version) if version is not None else None
        texts = answers(base_dir, adapter, prompts, args.tokens)
        met = [users.satisfied(args.line, p, a) for p, a in zip(prompts, texts, strict=True)]
        share = sum(met) / len(met)
        print(f"{name} (v{version}): satisfied {share:.3f} of {len(met)} fresh prompts")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
