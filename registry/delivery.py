"""An adapter's way from the registry to a vLLM replica that shares no disk with its trainer.

A version's files are the artifacts of its MLflow LoggedModel (any artifact store MLflow
reads: a local folder, ``mlflow-artifacts:`` proxied by an MLflow server, S3 and its kin
by configuration), with a digest recorded when it was logged (:func:`adapter_digest`,
the version tag ``flywheel.adapter_digest``). A replica fetches what it serves by name
into its own cache (:func:`fetch_adapter`): written aside, its digest checked, then
renamed, so a folder in the cache is always whole and verified. Before the folder is
loaded, the base model the adapter was trained on is compared with the one the replica
serves (:func:`base_refusal`): an adapter of another base is refused with the reason.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from flywheel.errors import FlywheelError
from registry.names import adapter_name
from training.base_model import BaseFingerprint, read_base_record

if TYPE_CHECKING:
    from registry.tracking import Registry

logger = logging.getLogger(__name__)

TAG_ADAPTER_DIGEST = "flywheel.adapter_digest"
TAG_BASE_NAME = "flywheel.base_model"
TAG_BASE_DIGEST = "flywheel.base_digest"
# The lineage tag every version has carried since the first: the base's folder name.
LEGACY_BASE_TAG = "base_model"
ADAPTER_CONFIG = "adapter_config.json"
# Tags a version carries for its delivery, copied from its LoggedModel at registration.
DELIVERY_TAGS = (TAG_ADAPTER_DIGEST, TAG_BASE_NAME, TAG_BASE_DIGEST)
REFUSED_EXIT_CODE = 8
_CHUNK = 1 << 20


class AdapterRefusedError(FlywheelError):
    """An adapter a replica must not serve: its files are not the registered ones, it was
    trained on another base model, or its version was rejected (exit code 8)."""

    exit_code = REFUSED_EXIT_CODE


class AdapterDigestError(AdapterRefusedError):
    """The files fetched for a version are not the files registered (their digest differs)."""


class BaseMismatchError(AdapterRefusedError):
    """The adapter was trained on another base model than the replica serves."""


def adapter_digest(folder: Path) -> str:
    """``sha256:<hex>`` over every regular file under ``folder``, in sorted relative POSIX
    path order: each file's path, size and bytes. Symbolic links and empty folders do not
    count (MLflow's artifact stores keep neither)."""
    if not folder.is_dir():
        raise FlywheelError(f"{folder} is not a folder")
    files = sorted(
        (path.relative_to(folder).as_posix(), path)
        for path in folder.rglob("*")
        if path.is_file() and not path.is_symlink()
    )
    digest = hashlib.sha256()
    for relative, path in files:
        size = path.stat().st_size
        digest.update(f"{relative}\0{size}\0".encode())
        with path.open("rb") as handle:
            while chunk := handle.read(_CHUNK):
                digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def delivery_tags(adapter_dir: Path, digest: str) -> dict[str, str]:
    """The delivery tags of an adapter folder whose digest is ``digest``: that digest, and
    the base its ``flywheel_base.json`` records (none for an adapter without one)."""
    tags = {TAG_ADAPTER_DIGEST: digest}
    base = read_base_record(adapter_dir)
    if base is not None:
        tags.update({TAG_BASE_NAME: base.name, TAG_BASE_DIGEST: base.digest})
    return tags


def recorded_base(tags: Mapping[str, str]) -> BaseFingerprint | None:
    """The base a version's tags say it was trained on: name and digest; a version from
    before digests were recorded has its base's name only (``digest`` empty); None when
    nothing is recorded."""
    digest = tags.get(TAG_BASE_DIGEST, "")
    name = tags.get(TAG_BASE_NAME) or tags.get(LEGACY_BASE_TAG) or ""
    if not digest and not name:
        return None
    return BaseFingerprint(name=name, digest=digest)


def _short(digest: str) -> str:
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}:{hexdigest[:12]}…" if hexdigest else digest


def base_refusal(adapter: BaseFingerprint | None, served: BaseFingerprint) -> str | None:
    """Why a replica serving ``served`` must refuse an adapter trained on ``adapter``; None
    when it may serve it: the digests match, or (an adapter from before digests were
    recorded: ``digest`` empty) the names match, or nothing was recorded at all."""
    if adapter is None:
        return None
    if adapter.digest:
        if adapter.digest == served.digest:
            return None
        return (
            f"trained on {adapter.name or 'an unnamed base'} ({_short(adapter.digest)}) but "
            f"this replica serves {served.name} ({_short(served.digest)})"
        )
    if not adapter.name or adapter.name == served.name:
        return None
    return (
        f"trained on {adapter.name} (no digest recorded: older version, checked by name only) "
        f"but this replica serves {served.name}"
    )


def rejection_of(tags: Mapping[str, str]) -> str | None:
    """Why a version is no longer served (its ``rolled_back`` reason), or None."""
    return tags.get("rolled_back") or None


def _verified(folder: Path, expected: str | None) -> bool:
    """Whether ``folder`` is a whole adapter whose digest is ``expected`` (any, if None)."""
    if not (folder / ADAPTER_CONFIG).is_file():
        return False
    return expected is None or adapter_digest(folder) == expected


def fetch_adapter(registry: Registry, line: str, version: int, cache_dir: Path) -> Path:
    """The folder ``cache_dir/<line>-v<version>`` holding the version's adapter files,
    fetched from its LoggedModel's artifacts (any store MLflow reads) and checked against
    the digest recorded at registration before it is renamed into place.

    A finished entry is reused once its digest checks out again (a few MB); one that does
    not is fetched anew. Raises :class:`AdapterDigestError` naming both digests when the
    fetched files differ, leaving nothing in the cache; a version registered before
    digests were recorded is fetched unchecked (a warning says so).
    """
    name = adapter_name(line, version)
    expected = registry.version_tags(line, version).get(TAG_ADAPTER_DIGEST)
    if expected is None:
        logger.warning("%s has no recorded digest (registered before digests): unchecked", name)
    target = cache_dir / name
    if target.is_dir():
        if _verified(target, expected):
            return target
        logger.warning(
            "%s in the cache %s is not the registered files: fetched again", name, cache_dir
        )
        shutil.rmtree(target)
    cache_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=cache_dir))
    try:
        fetched = registry.download_adapter(line, version, staging)
        if not (fetched / ADAPTER_CONFIG).is_file():
            raise FlywheelError(f"{name}: the registry's files hold no {ADAPTER_CONFIG}")
        found = adapter_digest(fetched)
        if expected is not None and found != expected:
            raise AdapterDigestError(
                f"{name}: the fetched files' digest {found} is not the registered {expected} "
                "(the artifact store's copy changed since registration); not served"
            )
        try:
            fetched.rename(target)
        except OSError:
            # Another fetch of the same version finished first; its files are checked too.
            if not _verified(target, expected):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
