"""Offline evaluation against the champion, the pure promotion gate, MLflow logging of eval runs."""
