"""Versions: what is installed (from metadata, no import), and PEP 440 comparison.

One copy for the whole package: device detection, the doctor and the notebooks ask here.
torch's ``__version__`` (``2.14.1+cu130``) and its distribution's version (``2.14.1``) name the
same release; so do ``2.1.0a0+git1234`` and ``2.1.0a0``: comparisons use the public version.
"""

from __future__ import annotations

import json
from importlib import metadata


def public_version(version: str) -> str:
    """The PEP 440 public version: local labels dropped (``2.14.1+cu130`` -> ``2.14.1``)."""
    from packaging.version import InvalidVersion, Version  # a dependency of nbtools (pyproject.toml)

    text = str(version).strip()
    try:
        return Version(text).public
    except InvalidVersion:
        return text.split("+", 1)[0]


def same_version(a: str | None, b: str | None) -> bool:
    """Do ``a`` and ``b`` name the same release? Compared by PEP 440 public version, so torch's
    ``__version__`` ``2.14.1+cu130`` equals its distribution's ``2.14.1`` (and ``2.1.0a0+git1234``
    equals ``2.1.0a0``); ``None`` (not installed) equals nothing."""
    return bool(a and b) and (a.strip() == b.strip() or public_version(a) == public_version(b))


def installed(distribution: str) -> str | None:
    """The installed version of a distribution (from its metadata, no import), or None."""
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def direct_url(distribution: str) -> dict:
    """How ``distribution`` was installed when not from an index (PEP 610 ``direct_url.json``: a folder, a git
    URL, a file); empty when from an index or not installed."""
    try:
        return json.loads(metadata.distribution(distribution).read_text("direct_url.json") or "{}")
    except (metadata.PackageNotFoundError, ValueError):
        return {}


def editable(distribution: str) -> bool:
    """Is the distribution an editable install (``pip install -e``)? False when it is not installed."""
    return bool(direct_url(distribution).get("dir_info", {}).get("editable", False))
