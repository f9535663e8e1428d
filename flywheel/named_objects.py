"""Loading an object a user names on the command line: ``path/to/file.py:NAME`` or
``package.module:NAME`` (a class is instantiated without arguments).

What fails to load, for whatever reason the module gives, is a :class:`NamedObjectError`
naming the option and the spec: exit 2 at the command line, never a stack trace.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path
from typing import Any

from flywheel.errors import UsageError


class NamedObjectError(UsageError):
    """The spec names nothing loadable; the message says what and why."""


def load_named_object(spec: str, option: str) -> Any:
    """The object ``spec`` names (instantiated when it is a class); ``option`` (``--users``)
    heads every error message."""
    target, sep, name = spec.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise NamedObjectError(
            f"{option} {spec}: expected path/to/file.py:NAME or package.module:NAME"
        )
    module = _module_from_file(spec, option, Path(target)) if target.endswith(".py") else None
    if module is None:
        try:
            module = importlib.import_module(target)
        except (Exception, SystemExit) as exc:
            raise NamedObjectError(
                f"{option} {spec}: cannot import {target}: {type(exc).__name__}: {exc}"
            ) from None
    if not hasattr(module, name):
        raise NamedObjectError(f"{option} {spec}: {target} has no {name}")
    obj = getattr(module, name)
    if inspect.isclass(obj):
        try:
            obj = obj()
        except (Exception, SystemExit) as exc:
            raise NamedObjectError(
                f"{option} {spec}: {name}() failed: {type(exc).__name__}: {exc}"
            ) from None
    return obj


def _module_from_file(spec: str, option: str, path: Path) -> Any:
    if not path.is_file():
        raise NamedObjectError(f"{option} {spec}: {path} does not exist")
    module_name = f"flywheel_users_{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]}"
    loader_spec = importlib.util.spec_from_file_location(module_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise NamedObjectError(f"{option} {spec}: {path} cannot be loaded as Python")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[module_name] = module
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(module_name, None)
        raise NamedObjectError(
            f"{option} {spec}: {path} failed to load: {type(exc).__name__}: {exc}"
        ) from None
    return module
