"""MLflow registry (versions, aliases, lineage), the vLLM adapter admin client, rollout state."""
