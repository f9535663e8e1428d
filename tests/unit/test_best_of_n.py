"""Best-of-n's offline sampling against the vLLM stand-in: what it asks for, from which model,
and that a failure yields no answers instead of failing the night."""

from __future__ import annotations

import asyncio

from composition.satisfaction import _sample_all
from eval.satisfaction import SatisfactionModelPolicy
from feedback.records import FeedbackRecord
from flywheel.settings import Settings
from tests.stub_vllm import BASE_MODEL, StubBehaviour, running_stub


def _records(count: int) -> list[FeedbackRecord]:
    return [
        FeedbackRecord.from_dict(
            {
                "request_id": f"r{i}",
                "business_line": "customer_service",
                "messages": [{"role": "user", "content": f"question {i}"}],
                "response": f"answer {i}",
                "created_at": "2026-12-05T00:00:00Z",
            }
        )
        for i in range(count)
    ]


def test_samples_come_from_the_served_base_model_with_the_recipe_s_settings(
    settings: Settings,
) -> None:
    policy = SatisfactionModelPolicy(
        pseudo_labels=True, best_of_n=3, best_of_max_tokens=40, best_of_temperature=0.9
    )
    with running_stub(StubBehaviour(answers={BASE_MODEL: "a sampled answer"})) as stub:
        answers = asyncio.run(_sample_all(stub.base_url, None, settings, _records(3), policy))
        sent = list(stub.received)
    assert answers == [["a sampled answer"]] * 3
    assert {body["model"] for body in sent} == {BASE_MODEL}
    assert {(body["n"], body["max_tokens"], body["temperature"]) for body in sent} == {(3, 40, 0.9)}
    assert len({body["seed"] for body in sent}) == 3
    assert sent[0]["messages"] == [{"role": "user", "content": "question 0"}]


def test_an_adapter_the_replica_lacks_yields_no_answers(settings: Settings) -> None:
    policy = SatisfactionModelPolicy(pseudo_labels=True, best_of_n=2)
    with running_stub(StubBehaviour()) as stub:
        answers = asyncio.run(
            _sample_all(stub.base_url, "customer_service-v9", settings, _records(2), policy)
        )
    assert answers == [[], []]
