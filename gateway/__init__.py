"""OpenAI-compatible proxy in front of vLLM: API keys, sticky canary split, interaction logging."""
