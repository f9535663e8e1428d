"""flywheel: from user feedback on an LLM service to better LoRA adapters, safely."""

__version__ = "0.1.0"
