"""The recipe's hardware fields (gradient checkpointing, 4-bit quantization) and how a training
maps them, with the device's precision, onto trl's config; a GPU is an ``Accelerator`` value.

The last tests (slow tier: they import trl) train a tiny random Llama for a few steps on the
CPU, checkpointing on and off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from composition.recipes import read_recipe
from flywheel.errors import FlywheelError, UsageError
from flywheel.hardware import Accelerator
from training.config import TrainingConfig, training_steps
from training.train import train_adapter, trainer_options

CPU = Accelerator()
CPU_BF16 = Accelerator(bf16=True)
H200 = Accelerator(device="cuda", bf16=True, bitsandbytes=True, name="NVIDIA H200")
T4 = Accelerator(device="cuda", bf16=False, bitsandbytes=True, name="Tesla T4")


def config(**fields: Any) -> TrainingConfig:
    return TrainingConfig.model_validate({"method": "sft", "max_steps": 3, **fields})


def write_recipe(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / "line.yaml"
    path.write_text(f"business_line: line\nmethod: sft\nepochs: 1\n{extra}\n", encoding="utf-8")
    return path


def test_the_new_fields_default_to_what_trainings_did_before() -> None:
    plain = config()
    assert plain.gradient_checkpointing == "auto"
    assert plain.quantization == "none"


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("gradient_checkpointing: auto", "auto"),
        ("gradient_checkpointing: true", True),
        ("gradient_checkpointing: false", False),
        ("quantization: 4bit", "4bit"),
        ("quantization: none", "none"),
    ],
)
def test_a_recipe_sets_the_hardware_fields(tmp_path: Path, line: str, expected: object) -> None:
    recipe = read_recipe(write_recipe(tmp_path, line))
    field = line.split(":", 1)[0]
    assert getattr(recipe, field) == expected


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ("gradient_checkpointing: sometimes", "gradient_checkpointing"),
        ("quantization: 8bit", "quantization"),
        ("quantization: 4", "quantization"),
    ],
)
def test_a_bad_value_is_refused_naming_the_field(tmp_path: Path, line: str, named: str) -> None:
    with pytest.raises(FlywheelError, match=rf"{named}"):
        read_recipe(write_recipe(tmp_path, line))


@pytest.mark.parametrize(
    ("schedule", "rows", "steps"),
    [
        ({"max_steps": 48}, 40, 48),
        ({"epochs": 1}, 40, None),
        # Two passes over 40 rows in batches of 4: 20 steps, under the cap.
        ({"epochs": 2, "max_steps": 48}, 40, 20),
        ({"epochs": 2, "max_steps": 48}, 41, 22),
        ({"epochs": 2, "max_steps": 48}, 400, 48),
        ({"epochs": 2, "max_steps": 48, "gradient_accumulation": 2}, 40, 10),
        ({"epochs": 0.1, "max_steps": 48}, 1, 1),
    ],
)
def test_passes_are_capped_at_max_steps(schedule: dict[str, Any], rows: int, steps: int) -> None:
    """With both set, a small night's set is passed over ``epochs`` times, not ``max_steps``
    steps' worth; a large one stops at ``max_steps``."""
    recipe = TrainingConfig.model_validate({"method": "sft", **schedule})
    assert training_steps(recipe, rows) == steps
    options = trainer_options(recipe, CPU, output_dir=Path("/runs/x"), rows=rows)
    if steps is None:
        assert options["num_train_epochs"] == 1
        assert "max_steps" not in options
    else:
        assert options["max_steps"] == steps
        assert "num_train_epochs" not in options


def test_on_a_gpu_with_bfloat16_a_training_runs_in_bfloat16_with_checkpointing() -> None:
    options = trainer_options(config(), H200, output_dir=Path("/runs/x"), rows=12)
    assert options["use_cpu"] is False
    assert (options["bf16"], options["fp16"]) == (True, False)
    assert options["activation_checkpointing"] is True
    assert options["activation_checkpointing_kwargs"] == {"use_reentrant": False}


def test_on_a_gpu_without_bfloat16_a_training_runs_in_float16() -> None:
    options = trainer_options(config(), T4, output_dir=Path("/runs/x"), rows=12)
    assert (options["bf16"], options["fp16"]) == (False, True)
    forced = trainer_options(config(precision="fp32"), T4, output_dir=Path("/runs/x"), rows=12)
    assert (forced["bf16"], forced["fp16"]) == (False, False)


def test_a_recipe_can_turn_checkpointing_off_on_a_gpu() -> None:
    options = trainer_options(
        config(gradient_checkpointing=False), H200, output_dir=Path("/runs/x"), rows=12
    )
    assert options["activation_checkpointing"] is False
    assert options["activation_checkpointing_kwargs"] is None


def test_on_the_cpu_nothing_changes() -> None:
    """float32 weights, bfloat16 autocast only on a CPU with it natively, and checkpointing on
    as trl's trainers always had it here."""
    plain = trainer_options(config(), CPU, output_dir=Path("/runs/x"), rows=12)
    assert plain["use_cpu"] is True
    assert (plain["bf16"], plain["fp16"]) == (False, False)
    assert plain["activation_checkpointing"] is True
    native = trainer_options(config(), CPU_BF16, output_dir=Path("/runs/x"), rows=12)
    assert (native["bf16"], native["fp16"]) == (True, False)


@pytest.mark.slow  # importing trl alone takes 10-30 s on a shared 2-core machine
def test_trl_reads_the_checkpointing_switch_from_these_options(tmp_path: Path) -> None:
    from trl import SFTConfig

    for setting in (True, False):
        options = trainer_options(
            config(gradient_checkpointing=setting), CPU, output_dir=tmp_path, rows=12
        )
        args = SFTConfig(**options)
        assert args.gradient_checkpointing is setting
        assert args.activation_checkpointing is setting


def test_a_4bit_recipe_is_refused_on_the_cpu_before_anything_loads(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"quantization: 4bit .* needs a CUDA GPU") as refused:
        train_adapter(
            config(quantization="4bit"),
            base_model_dir=tmp_path / "no-model-here",
            rows=[{"prompt": "p", "completion": "c"}],
            output_dir=tmp_path / "run",
            device="cpu",
        )
    assert refused.value.exit_code == 2
    assert "bitsandbytes" in str(refused.value)
    assert not (tmp_path / "run").exists()


# --- a few steps of training on the CPU -------------------------------------------------------

WORDS = ["what", "is", "the", "sky", "grass", "colour", "?", "blue", "green", "it", "."]
SPECIALS = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {{ m['content'] }}<|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}"
)


@pytest.fixture(scope="module")
def tiny_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer random Llama and a word-level tokenizer with a chat template, saved as a
    model folder (no download)."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {word: index for index, word in enumerate(SPECIALS + WORDS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=128,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        )
    )
    folder = tmp_path_factory.mktemp("tiny-base")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def sky_rows() -> list[dict[str, Any]]:
    pairs = [("what is the sky colour ?", "it is blue ."), ("what is the grass colour ?", "green")]
    return [
        {
            "prompt": [{"role": "user", "content": question}],
            "completion": [{"role": "assistant", "content": answer}],
        }
        for question, answer in pairs * 4
    ]


@pytest.mark.slow  # 7-15 s each on a shared 2-core machine, trl's import on top
@pytest.mark.parametrize("checkpointing", [True, False])
def test_a_few_steps_train_on_the_cpu_with_checkpointing_on_and_off(
    tiny_base: Path, tmp_path: Path, checkpointing: bool
) -> None:
    recipe = config(
        gradient_checkpointing=checkpointing,
        precision="fp32",
        batch_size=4,
        max_length=32,
        lora={"rank": 4, "alpha": 8, "dropout": 0.0},
        learning_rate=1e-2,
    )
    result = train_adapter(
        recipe, base_model_dir=tiny_base, rows=sky_rows(), output_dir=tmp_path, device="cpu"
    )
    assert result.steps == 3
    assert result.device == "cpu"
    assert result.weights_dtype == "float32"
    assert result.gradient_checkpointing is checkpointing
    assert result.peak_gpu_memory_mb is None
    losses = [entry["loss"] for entry in result.history if "loss" in entry]
    assert len(losses) == 3
    assert losses[-1] < losses[0]
    assert (result.adapter_dir / "adapter_config.json").exists()


def test_a_line_whose_recipe_needs_a_gpu_is_refused_before_a_training_run_opens(
    settings: Any, tmp_path: Path
) -> None:
    """On a machine without a CUDA GPU a 4-bit recipe stops the line with the reason (exit
    2 at the command line), and no MLflow run is opened for it."""
    from composition.line_training import train_line
    from tests.fake_clients import fake_clients

    recipes = tmp_path / "recipes"
    recipes.mkdir()
    (recipes / "legal.yaml").write_text(
        "business_line: legal\nmethod: sft\nmax_steps: 1\nquantization: 4bit\n"
    )
    settings = settings.model_copy(update={"recipes_dir": recipes})

    class Registry:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the registry was used: {name}")

    with pytest.raises(UsageError, match=r"legal: .*4bit"):
        train_line(settings, fake_clients(settings, registry=Registry()), "legal")
