"""The feedback page: per-line signals, cleaning funnel, samples, routing and eval review."""
