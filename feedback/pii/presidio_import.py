"""Import Presidio's analyzer without the Hugging Face engine that the scrubber never uses.

``presidio_analyzer`` imports its optional transformers NLP engine on import, and
that engine runs ``from transformers import pipeline`` when transformers is
installed (it is here, for training): about 3.5 CPU seconds, a third of a
cleaning worker's start, for a pipeline no recognizer of the scrubber calls.
Presidio guards that import (no transformers: the engine is just unavailable),
so the analyzer is imported here with transformers hidden from this thread only.
Other threads import as usual, and so does this thread afterwards: a process that
trains still imports transformers in full when it needs it. Where transformers or
Presidio is already imported, nothing changes.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

_HIDDEN = "transformers"


class _HiddenFromThread(MetaPathFinder):
    """Refuses one package (and its submodules) to one thread; other imports pass by."""

    def __init__(self, package: str) -> None:
        self._package = package
        self._thread = threading.get_ident()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> ModuleSpec | None:
        hidden = fullname == self._package or fullname.startswith(f"{self._package}.")
        if hidden and threading.get_ident() == self._thread:
            raise ModuleNotFoundError(f"{fullname} is not imported with Presidio", name=fullname)
        return None


def import_presidio() -> None:
    """Import ``presidio_analyzer`` (once per process) without its transformers engine."""
    if "presidio_analyzer" in sys.modules or _HIDDEN in sys.modules:
        return
    finder = _HiddenFromThread(_HIDDEN)
    sys.meta_path.insert(0, finder)
    try:
        import presidio_analyzer  # noqa: F401
    finally:
        sys.meta_path.remove(finder)
