"""Recipes per business line and LoRA SFT / DPO training on peft + trl."""
