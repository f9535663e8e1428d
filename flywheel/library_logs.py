"""Where the libraries' chatter goes while a command runs: a file, not the terminal.

transformers, trl, peft, datasets, MLflow and Python's warnings each print to the
terminal in their own way (log lines, ``\\r`` progress bars, deprecation notices);
the CLI shows one progress line per stage instead, and :func:`library_logs_to_file`
sends the rest to ``FLYWHEEL_HOME/logs/`` for whoever needs to read it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

# The libraries a night calls into; their loggers write to the file alone while it is open.
LIBRARY_LOGGERS = (
    "transformers",
    "trl",
    "peft",
    "accelerate",
    "datasets",
    "huggingface_hub",
    "torch",
    "mlflow",
    "alembic",
    "httpx",
    "py.warnings",
)
# torch's components (inductor, dynamo) log through handlers of their own, to the terminal,
# at their parent's level: at INFO they print "compile_threads set to 2" and frame reports.
QUIETER = {"torch": logging.WARNING}
# Progress bars the libraries draw with tqdm: off (tqdm reads TQDM_* as its defaults; the
# Hugging Face libraries read their own switch).
QUIET_BARS = {
    "TQDM_DISABLE": "1",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
}


@contextmanager
def library_logs_to_file(home: Path, name: str = "libraries") -> Iterator[Path]:
    """Send the libraries' log lines and Python's warnings to a new file under
    ``home/logs/`` (yielded), the training steps (logger ``training``) there too, and turn
    the libraries' progress bars off; all as it was when the block ends."""
    folder = home / "logs"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{datetime.now(UTC):%Y%m%d-%H%M%S}.log"
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    # Imported first: each sets its own handlers up on import, which would replace ours.
    _import_noisy_libraries()
    saved_env = {key: os.environ.get(key) for key in QUIET_BARS}
    os.environ.update(QUIET_BARS)
    bars = _progress_bars(enabled=False)
    saved = {}
    for logger_name in LIBRARY_LOGGERS:
        logger = logging.getLogger(logger_name)
        saved[logger_name] = (logger.handlers[:], logger.propagate, logger.level)
        logger.handlers = [handler]
        logger.propagate = False
        logger.setLevel(QUIETER.get(logger_name, logging.INFO))
    training = logging.getLogger("training")
    training_level = training.level
    training.addHandler(handler)
    if training.getEffectiveLevel() > logging.INFO:
        training.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield path
    finally:
        logging.captureWarnings(False)
        training.removeHandler(handler)
        training.setLevel(training_level)
        for logger_name, (handlers, propagate, level) in saved.items():
            logger = logging.getLogger(logger_name)
            logger.handlers = handlers
            logger.propagate = propagate
            logger.setLevel(level)
        _progress_bars(enabled=bars)
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        handler.close()


def _import_noisy_libraries() -> None:
    # torch too: transformers imports it lazily, and torch sets its logger's level on import,
    # a level the block must save (restoring "none" left torch at the root's level).
    import datasets  # noqa: F401
    import mlflow  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401


def _progress_bars(*, enabled: bool) -> bool:
    """Turn the Hugging Face libraries' progress bars on or off; whether they were on."""
    import datasets.utils as datasets_bars
    import huggingface_hub.utils as hub_bars
    from transformers.utils import logging as transformers_bars

    was = bool(transformers_bars.is_progress_bar_enabled())
    if enabled:
        transformers_bars.enable_progress_bar()
        datasets_bars.enable_progress_bars()
        hub_bars.enable_progress_bars()
    else:
        transformers_bars.disable_progress_bar()
        datasets_bars.disable_progress_bars()
        hub_bars.disable_progress_bars()
    return was
