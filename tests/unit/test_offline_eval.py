"""Offline metrics on a tiny random Llama with a word-level tokenizer built here (no download)."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from eval.offline import (
    EvalData,
    HeldOutPair,
    PromptAnswer,
    answer_logprobs,
    check_generations,
    evaluate_model,
    is_refusal,
    load_eval_data,
    load_for_eval,
    load_general_set,
    masked,
    mean_token_loss,
    pair_wins,
    pii_detector_for,
    preference_metrics,
    training_answers_hold,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

WORDS = [
    *["what", "is", "the", "capital", "of", "france", "paris", "?", ".", ",", "'", "two"],
    *["plus", "three", "five", "four", "yes", "no", "i", "can", "t", "help", "sorry"],
    *["hello", "please", "say", "a", "word", "blue", "green", "red", "sky", "grass"],
    *["colour", "banana"],
]
SPECIALS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant", "system"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    # Tiny matrices: a second intra-op thread only adds contention on a shared machine.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def ask(text: str) -> tuple[dict[str, str], ...]:
    return ({"role": "user", "content": text},)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )
    tok.chat_template = CHAT_TEMPLATE
    return tok


def tiny_model(tokenizer: Any, seed: int = 0) -> Any:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def model(tokenizer: Any) -> Any:
    return tiny_model(tokenizer)


PROMPTS = [
    list(ask("what is the capital of france ?")),
    list(ask("two plus three")),
    [
        {"role": "system", "content": "please say a word"},
        {"role": "user", "content": "hello , what colour is the sky ?"},
    ],
    list(ask("hello")),
]
ANSWERS = ["paris .", "five", "the sky is blue , the grass is green .", ""]
GENERAL = (PromptAnswer(ask("what colour is the grass ?"), "green ."),)


def reference_logprob(model: Any, tokenizer: Any, prompt_ids: list[int], answer: str) -> float:
    """The answer's summed log-probability from one unpadded forward pass over everything."""
    answer_ids = [*tokenizer(answer, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
    ids = torch.tensor([prompt_ids + answer_ids])
    with torch.no_grad():
        logprobs = model(input_ids=ids).logits[0].log_softmax(-1)
    start = len(prompt_ids)
    return sum(float(logprobs[start + k - 1, t]) for k, t in enumerate(answer_ids))


def prompt_ids(tokenizer: Any, prompt: list[dict[str, str]]) -> list[int]:
    text = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def test_only_the_answer_and_its_eos_are_scored(model: Any, tokenizer: Any) -> None:
    scores = answer_logprobs(model, tokenizer, PROMPTS, ANSWERS, batch_size=4)

    for prompt, answer, (logprob, count) in zip(PROMPTS, ANSWERS, scores, strict=True):
        assert count == len(tokenizer(answer, add_special_tokens=False)["input_ids"]) + 1
        expected = reference_logprob(model, tokenizer, prompt_ids(tokenizer, prompt), answer)
        assert logprob == pytest.approx(expected, abs=1e-4)


def test_the_prompt_conditions_the_score_but_is_not_counted(model: Any, tokenizer: Any) -> None:
    prompts = [list(ask("what is the capital of france ?")), list(ask("two plus three ?"))]
    (first, n_first), (second, n_second) = answer_logprobs(
        model, tokenizer, prompts, ["paris .", "paris ."]
    )

    assert n_first == n_second == 3
    assert first != pytest.approx(second, abs=1e-4)


def test_batches_give_the_numbers_of_one_by_one(model: Any, tokenizer: Any) -> None:
    together = answer_logprobs(model, tokenizer, PROMPTS, ANSWERS, batch_size=3)
    alone = answer_logprobs(model, tokenizer, PROMPTS, ANSWERS, batch_size=1)

    assert [n for _, n in together] == [n for _, n in alone]
    assert [s for s, _ in together] == pytest.approx([s for s, _ in alone], abs=1e-4)


def test_a_long_prompt_loses_its_start_never_the_answer(model: Any, tokenizer: Any) -> None:
    prompt = list(ask("please say a word , " * 10 + "what colour is the sky ?"))
    answer = "blue sky ."

    ((logprob, count),) = answer_logprobs(model, tokenizer, [prompt], [answer], max_length=12)

    assert count == 4
    kept = prompt_ids(tokenizer, prompt)[-(12 - 4) :]
    assert logprob == pytest.approx(reference_logprob(model, tokenizer, kept, answer), abs=1e-4)


def test_an_answer_longer_than_the_window_keeps_its_first_tokens(
    model: Any, tokenizer: Any
) -> None:
    answer = "blue green red " * 5
    prompt = list(ask("say a word"))

    ((logprob, count),) = answer_logprobs(model, tokenizer, [prompt], [answer], max_length=8)

    assert count == 7
    last_prompt_token = prompt_ids(tokenizer, prompt)[-1:]
    expected = _prefix_logprob(model, tokenizer, last_prompt_token, answer, 7)
    assert logprob == pytest.approx(expected, abs=1e-4)


def _prefix_logprob(model: Any, tokenizer: Any, prefix: list[int], answer: str, n: int) -> float:
    answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])[:n]
    ids = torch.tensor([prefix + answer_ids])
    with torch.no_grad():
        logprobs = model(input_ids=ids).logits[0].log_softmax(-1)
    return sum(float(logprobs[len(prefix) + k - 1, t]) for k, t in enumerate(answer_ids))


def test_preference_compares_log_probability_per_token() -> None:
    # The chosen answer is less likely in total but more likely per token: preferred.
    chosen = [(-6.0, 3), (-2.0, 2), (-5.0, 5)]
    rejected = [(-4.0, 1), (-3.0, 1), (-5.0, 5)]

    accuracy, margin = preference_metrics(chosen, rejected)

    assert accuracy == pytest.approx(2 / 3)  # the tie does not count as preferred
    assert margin == pytest.approx(((-2 + 4) + (-1 + 3) + 0) / 3)
    assert preference_metrics([], []) == (None, None)
    assert pair_wins(chosen, rejected) == (True, True, False)


def test_losses_are_token_weighted() -> None:
    assert mean_token_loss([(-2.0, 1), (-4.0, 3)]) == pytest.approx(1.5)
    assert mean_token_loss([]) is None


@pytest.mark.parametrize(
    ("answer", "refused"),
    [
        ("I can't help with that request.", True),
        ("Sorry, I cannot share personal data.", True),
        ("I’m unable to open links.", True),
        ("As an AI, I do not have opinions.", True),
        ("抱歉，我无法提供这些信息。", True),
        ("我不能回答这个问题。", True),
        ("作为一个人工智能，我没有个人观点。", True),
        ("The capital of France is Paris.", False),
        ("You cannot divide by zero.", False),
        ("中国的首都是北京。", False),
    ],
)
def test_refusals_are_recognised_in_english_and_chinese(answer: str, refused: bool) -> None:
    assert is_refusal(answer) is refused


def test_generation_checks_count_pii_and_canaries() -> None:
    def detector(texts: list[str]) -> list[list[tuple[str, int, int]]]:
        return [
            [("EMAIL_ADDRESS", m.start(), m.end()) for m in re.finditer(r"\S+@\S+", t)]
            for t in texts
        ]

    samples = check_generations(
        ["q1", "q2"],
        ["mail a@x.org or b@y.org", "the code is CANARY-7f3a"],
        canaries=["CANARY-7f3a", "CANARY-0000"],
        pii_detector=detector,
    )

    assert [s.pii_found for s in samples] == [("EMAIL_ADDRESS", "EMAIL_ADDRESS"), ()]
    # What was found never leaves in the sample (it reaches MLflow and the page).
    assert samples[0].answer == "mail <EMAIL_ADDRESS> or <EMAIL_ADDRESS>"
    assert samples[1].answer == "the code is CANARY-7f3a"
    assert [s.canaries_found for s in samples] == [(), ("CANARY-7f3a",)]
    assert [s.refused for s in samples] == [False, False]


def test_a_scrubber_becomes_a_detector_of_entity_types() -> None:
    @dataclasses.dataclass
    class Found:
        entity_type: str
        start: int
        end: int

    class Scrubber:
        def detect(self, texts: list[str]) -> list[list[Found]]:
            return [
                [Found("PERSON", 3, 8)] * ("Alice" in t) + [Found("EMAIL_ADDRESS", 0, 2)]
                for t in texts
            ]

    assert pii_detector_for(Scrubber())(["hi Alice", "hi"]) == [
        [("PERSON", 3, 8), ("EMAIL_ADDRESS", 0, 2)],
        [("EMAIL_ADDRESS", 0, 2)],
    ]


def test_every_pii_type_is_masked_and_only_the_counted_ones_count() -> None:
    def detector(texts: list[str]) -> list[list[tuple[str, int, int]]]:
        return [[("PERSON", 5, 10), ("PHONE_NUMBER", 14, 22)] for _ in texts]

    [sample] = check_generations(
        ["q"], ["Call Alice on 555-0100 today"], pii_detector=detector,
        counted_pii={"PHONE_NUMBER"},
    )  # fmt: skip
    assert sample.answer == "Call <PERSON> on <PHONE_NUMBER> today"
    assert sample.pii_found == ("PHONE_NUMBER",)


def test_a_value_no_training_answer_holds_is_named_made_up(tmp_path: Path) -> None:
    """A card-like number the model writes into a link, which none of the answers it was
    trained on holds (they are scrubbed), it made up; one they hold, it may have learnt."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    def reply(text: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": text}]

    sft = [{"prompt": list(ask("q")), "completion": reply("Refund to card 4111 1111 1111 1111.")}]
    dpo = [{"prompt": list(ask("q")), "chosen": reply("fine"), "rejected": reply("IBAN DE89")}]
    pq.write_table(pa.Table.from_pylist(sft), tmp_path / "sft_train.parquet")
    pq.write_table(pa.Table.from_pylist(dpo), tmp_path / "dpo_train.parquet")
    holds = training_answers_hold(tmp_path)
    assert holds("4111-1111-1111-1111")
    assert holds("de89")
    assert not holds("5500 0000 0000 0004")
    assert holds("--")  # nothing to compare: counted as held, never as made up

    def detector(texts: list[str]) -> list[list[tuple[str, int, int]]]:
        return [
            [("CREDIT_CARD", m.start(), m.end()) for m in re.finditer(r"\d[\d -]{14,}\d", t)]
            for t in texts
        ]

    made_up, learnt = check_generations(
        ["q1", "q2"],
        ["see example.com/dp/5500000000000004/", "your card 4111111111111111 is refunded"],
        pii_detector=detector,
        trained_on=holds,
    )
    assert made_up.pii_found == ("CREDIT_CARD",)
    assert made_up.pii_invented == ("CREDIT_CARD",)
    assert made_up.answer == "see example.com/dp/<CREDIT_CARD>/"
    assert learnt.pii_found == ("CREDIT_CARD",)
    assert learnt.pii_invented == ()
    # Unchecked, nothing is named made up; the raw value never stays in a sample.
    [unchecked] = check_generations(["q1"], ["dp/5500000000000004"], pii_detector=detector)
    assert unchecked.pii_invented == ()
    assert "5500" not in repr((made_up, learnt, unchecked))


def test_masking_replaces_each_span_once_and_leaves_the_rest() -> None:
    text = "call (800) 333-3333 or mail a@b.org"
    spans = [("EMAIL_ADDRESS", 28, 35), ("PHONE_NUMBER", 5, 19), ("PERSON", 6, 9), ("X", 30, 99)]
    assert masked(text, spans) == "call <PHONE_NUMBER> or mail <EMAIL_ADDRESS>"
    assert masked(text, []) == text


def data() -> EvalData:
    pairs = (
        HeldOutPair(ask("what is the capital of france ?"), "paris .", "banana banana"),
        HeldOutPair(ask("two plus three"), "five", "sorry i can t help"),
        HeldOutPair(ask("what colour is the sky ?"), "blue .", "four"),
    )
    preferred = (*(PromptAnswer(p.prompt, p.chosen) for p in pairs),)
    preferred += (PromptAnswer(ask("say a word"), "hello"),)
    return EvalData(pairs, preferred, (ask("hello"), ask("what is the capital of france ?")))


def test_evaluate_reports_every_metric(model: Any, tokenizer: Any) -> None:
    first = evaluate_model(
        model, tokenizer, data(), name="tiny", general_set=GENERAL, max_new_tokens=4
    )
    generated = first.samples[0].answer
    assert generated

    report = evaluate_model(
        model,
        tokenizer,
        data(),
        name="tiny",
        general_set=GENERAL,
        canaries=[generated, generated, "never said"],
        pii_detector=lambda texts: [[("PERSON", 0, 1)] for _ in texts],
        max_new_tokens=4,
    )

    assert report.pairs == 3
    assert 0 <= report.preference_accuracy <= 1  # type: ignore[operator]
    assert len(report.pair_wins) == 3
    assert sum(report.pair_wins) / 3 == pytest.approx(report.preference_accuracy)
    assert report.general_loss > 0
    assert report.preferred_loss > 0  # type: ignore[operator]
    assert [s.prompt for s in report.samples] == ["hello", "what is the capital of france ?"]
    # Lengths are the answers' own; the samples keep them masked where PII was found.
    assert report.mean_answer_length == sum(len(s.answer) for s in first.samples) / 2
    assert report.pii_in_generations == 2
    assert report.canaries_in_generations == 1
    assert [s.answer for s in report.samples] == [
        masked(s.answer, [("PERSON", 0, 1)]) for s in first.samples
    ]
    assert report.samples[0].canaries_found == (generated, generated)


def test_swapping_chosen_and_rejected_mirrors_the_preference(model: Any, tokenizer: Any) -> None:
    swapped = EvalData(
        tuple(HeldOutPair(p.prompt, p.rejected, p.chosen) for p in data().pairs), (), ()
    )

    plain = evaluate_model(model, tokenizer, data(), name="a", general_set=GENERAL)
    mirrored = evaluate_model(model, tokenizer, swapped, name="b", general_set=GENERAL)

    assert plain.preference_accuracy == pytest.approx(1 - mirrored.preference_accuracy)  # type: ignore[operator]
    assert [not won for won in plain.pair_wins] == list(mirrored.pair_wins)
    assert plain.mean_margin == pytest.approx(-mirrored.mean_margin, abs=1e-5)  # type: ignore[operator]
    assert mirrored.preferred_loss is None
    assert mirrored.samples == ()


def test_a_model_taught_the_chosen_answers_prefers_every_one(tokenizer: Any) -> None:
    student = tiny_model(tokenizer, seed=1)
    before = evaluate_model(student, tokenizer, data(), name="before", general_set=GENERAL)
    texts = [
        tokenizer.apply_chat_template(
            [*p.prompt, {"role": "assistant", "content": p.chosen}], tokenize=False
        )
        for p in data().pairs
    ]
    batch = tokenizer(texts, add_special_tokens=False, padding=True, return_tensors="pt")
    labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
    optimizer = torch.optim.Adam(student.parameters(), lr=1e-2)
    student.train()
    for _ in range(30):
        optimizer.zero_grad()
        student(**batch, labels=labels).loss.backward()
        optimizer.step()

    after = evaluate_model(student, tokenizer, data(), name="after", general_set=GENERAL)

    assert student.training  # evaluation put back the mode it found
    assert after.preference_accuracy == 1.0
    assert after.pair_wins == (True, True, True)
    assert after.mean_margin > before.mean_margin  # type: ignore[operator]
    assert after.preferred_loss < before.preferred_loss  # type: ignore[operator]


def test_held_out_data_is_read_from_whichever_eval_files_exist(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    def reply(text: str) -> list[dict[str, str]]:
        return [{"role": "assistant", "content": text}]

    dpo = [
        {"prompt": list(ask(f"q{i}")), "chosen": reply(f"good {i}"), "rejected": reply("bad")}
        for i in range(5)
    ]
    sft = [{"prompt": list(ask("q0")), "completion": reply("also good")}]
    kto = [
        {"prompt": list(ask("k1")), "completion": reply("liked"), "label": True},
        {"prompt": list(ask("k2")), "completion": reply("disliked"), "label": False},
    ]
    for name, rows in (("dpo_eval", dpo), ("sft_eval", sft), ("kto_eval", kto)):
        pq.write_table(pa.Table.from_pylist(rows), tmp_path / f"{name}.parquet")
    pq.write_table(pa.Table.from_pylist(sft), tmp_path / "sft_train.parquet")

    loaded = load_eval_data(tmp_path, max_pairs=3, max_samples=4)

    assert [(p.prompt[0]["content"], p.chosen, p.rejected) for p in loaded.pairs] == [
        ("q0", "good 0", "bad"),
        ("q1", "good 1", "bad"),
        ("q2", "good 2", "bad"),
    ]
    assert [p.answer for p in loaded.preferred] == [
        "good 0",
        "good 1",
        "good 2",
        "also good",
        "liked",
    ]
    assert [p[0]["content"] for p in loaded.sample_prompts] == ["q0", "q1", "q2", "k1"]
    every_prompt = load_eval_data(tmp_path, max_pairs=3, max_samples=10).sample_prompts
    assert [p[0]["content"] for p in every_prompt] == ["q0", "q1", "q2", "k1", "k2"]

    (tmp_path / "dpo_eval.parquet").unlink()
    only_sft = load_eval_data(tmp_path)
    assert only_sft.pairs == ()
    assert [p.answer for p in only_sft.preferred] == ["also good", "liked"]


def test_the_general_set_ships_english_and_chinese_items() -> None:
    items = load_general_set()
    chinese = [i for i in items if any("\u4e00" <= ch <= "\u9fff" for ch in i.prompt[0]["content"])]

    assert len(items) - len(chinese) >= 30
    assert len(chinese) >= 10
    assert all(i.answer.strip() and i.prompt[0]["role"] == "user" for i in items)
    assert len({i.prompt[0]["content"] for i in items}) == len(items)


def test_a_base_model_and_its_adapter_load_for_eval(
    tmp_path: Path, model: Any, tokenizer: Any
) -> None:
    peft = pytest.importorskip("peft")
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    lora = peft.get_peft_model(
        tiny_model(tokenizer), peft.LoraConfig(r=2, target_modules=["q_proj", "v_proj"])
    )
    lora.save_pretrained(tmp_path / "adapter")

    base, base_tok = load_for_eval(tmp_path / "base", None, device="cpu")
    adapted, adapted_tok = load_for_eval(tmp_path / "base", tmp_path / "adapter", device="cpu")

    assert not base.training
    assert not adapted.training
    assert json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())["r"] == 2
    # A fresh LoRA adds zero (B starts at 0), so both score the same.
    plain = answer_logprobs(base, base_tok, PROMPTS, ANSWERS)
    with_adapter = answer_logprobs(adapted, adapted_tok, PROMPTS, ANSWERS)
    assert [s for s, _ in with_adapter] == pytest.approx([s for s, _ in plain], abs=1e-4)


def test_a_missing_model_folder_is_reported(tmp_path: Path) -> None:
    from flywheel.errors import FlywheelError

    with pytest.raises(FlywheelError, match="not a model folder"):
        load_for_eval(tmp_path)
