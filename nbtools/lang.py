"""The learner's language: every message nbtools shows a learner comes from one catalogue per language
(``nbtools/messages/<lang>.json``, data: ``msg(key, **values)`` formats its entry).

The language is the notebook's, never the machine's locale: ``metadata.nbtools_translation.lang`` (the English
edition, ``notebooks/en/``), else its folder's name where a catalogue has that name, else Chinese. A kernel learns
which notebook it runs from ``JPY_SESSION_NAME``, the notebook's path, which JupyterLab 4's server sets for every
kernel (ipykernel shows it as ``__session__``) and ``nbtools run`` sets the same way; without it (plain papermill, a
terminal) from the folder the process started in, which is the notebook's under papermill and JupyterLab alike.
``NBTOOLS_LANG=en`` overrides both. The CLI, logs and reports' own words stay English.
"""

from __future__ import annotations

import json
import os
from functools import cache, lru_cache
from pathlib import Path

CATALOGUES = Path(__file__).parent / "messages"
DEFAULT = "zh"
SESSION_ENV = "JPY_SESSION_NAME"  # the notebook's path, as JupyterLab 4 and the runner tell a kernel (workdir names by it)
try:
    _STARTED_IN = Path.cwd()  # at import, before the setup cell moves into a work folder
except OSError:
    _STARTED_IN = Path(".")


@cache
def catalogue(lang: str) -> dict[str, str]:
    return json.loads((CATALOGUES / f"{lang}.json").read_text(encoding="utf-8"))


def known(lang: str | None) -> str:
    return lang if lang and (CATALOGUES / f"{lang}.json").is_file() else DEFAULT


def _named(metadata: dict | None) -> str | None:
    return (metadata or {}).get("nbtools_translation", {}).get("lang")


def of_metadata(metadata: dict) -> str:
    """The language a notebook's metadata names (``nbtools_translation.lang``), else this process' (a notebook made
    by a lesson's code is judged in the lesson's language)."""
    return known(_named(metadata)) if _named(metadata) else current()


@lru_cache(maxsize=64)
def of_notebook(path: str) -> str:
    """A notebook's language: its metadata's, else DEFAULT; its folder's name where a catalogue has it when it
    cannot be read."""
    try:
        return known(_named(json.loads(Path(path).read_text(encoding="utf-8"))["metadata"]))
    except (OSError, ValueError, KeyError, TypeError):
        return known(Path(path).parent.name)


def current() -> str:
    """The language of the notebook this process runs for (NBTOOLS_LANG, JPY_SESSION_NAME, the start folder)."""
    if lang := os.environ.get("NBTOOLS_LANG"):
        return known(lang)
    return of_notebook(os.environ.get(SESSION_ENV) or str(_STARTED_IN / "_"))


def msg(key: str, lang: str | None = None, /, **values) -> str:
    """The catalogue's entry ``key`` in ``lang`` (default: current()), formatted with ``values``."""
    return catalogue(lang or current())[key].format(**values)
