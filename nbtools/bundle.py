"""``python -m nbtools report RUN_DIR --bundle``: one zip a 910B owner can send back (README, Tested stacks).

It holds the run's report.json, result.json and junit.xml, and environment.txt (npu-smi's table, the installed
packages, ``accelerate env``). Every file goes through ``scrub`` first: the machine's paths (the repository, the
run folder, the home folder, the temporary folder, the interpreter), its host and user names, and anything that
looks like a token or the value of a secret variable are replaced by a placeholder in angle brackets.
"""

from __future__ import annotations

import getpass
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from .errors import NbtoolsError

FILES = ("report.json", "result.json", "junit.xml")
_TOKENS = re.compile(r"\b(?:hf_|ghp_|gho_|ghs_|github_pat_|sk-)[A-Za-z0-9_]{16,}")
_SECRET = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|ACCESS_KEY", re.I)


def _replacements(run_dir: Path) -> list[tuple[str, str]]:
    root = Path(__file__).resolve().parent.parent
    pairs = [(str(run_dir.resolve()), "<run>"), (str(root), "<repo>"), (sys.prefix, "<python>"),
             (os.path.realpath(tempfile.gettempdir()), "<tmp>"), (str(Path.home()), "<home>")]
    pairs += [(v, f"<{k}>") for k, v in os.environ.items() if _SECRET.search(k) and len(v) >= 6]
    for name in {socket.gethostname(), socket.getfqdn(), getpass.getuser()}:
        if len(name or "") >= 4 and name not in ("localhost", "root"):
            pairs.append((name, "<host>" if name != getpass.getuser() else "<user>"))
    return sorted(pairs, key=lambda p: -len(p[0]))  # the longest first: /home/u/repo before /home/u


def scrub(text: str, pairs: list[tuple[str, str]]) -> str:
    for old, new in pairs:
        text = text.replace(old, new)
    return re.sub(r"/(?:home|Users)/[^/\s\"']+", "<home>", _TOKENS.sub("<token>", text))


def environment_text() -> str:
    """npu-smi's table, the installed packages and ``accelerate env``, each under the command that printed it."""
    said = []
    for argv in (["npu-smi", "info"], [sys.executable, "-m", "pip", "list", "--format=freeze"], ["accelerate", "env"]):
        found = shutil.which(argv[0])
        proc = found and subprocess.run(argv, capture_output=True, text=True, timeout=120, errors="replace")
        said.append(f"$ {' '.join(argv)}\n" + (proc.stdout + proc.stderr if proc else "(not found on this machine)\n"))
    return "\n".join(said)


def write_bundle(run_dir: Path, to: Path | None = None) -> Path:
    """Zip the run in ``run_dir`` (a ``python -m nbtools run --output`` folder), scrubbed; returns the zip's path."""
    if missing := [name for name in FILES if not (run_dir / name).is_file()]:
        raise NbtoolsError(f"{run_dir} has no {', '.join(missing)}: give the --output folder of a finished "
                           "`python -m nbtools run`")
    pairs, to = _replacements(run_dir), to or run_dir / "nbtools-bundle.zip"
    with zipfile.ZipFile(to, "w", zipfile.ZIP_DEFLATED) as z:
        for name in FILES:
            z.writestr(name, scrub((run_dir / name).read_text(encoding="utf-8"), pairs))
        z.writestr("environment.txt", scrub(environment_text(), pairs))
    return to
