"""The A/B experiments' use cases live in :mod:`composition.experiments`; these names stay
here until the last caller (a vLLM integration test edited elsewhere) imports them there."""

from composition.experiments import look_experiment, promote_experiment, start_experiment

__all__ = ["look_experiment", "promote_experiment", "start_experiment"]
