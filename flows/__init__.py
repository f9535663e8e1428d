"""Prefect flows and deployments that compose the packages; they read like a table of contents."""
