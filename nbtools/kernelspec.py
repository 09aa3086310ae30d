"""A Jupyter kernel spec that loads CANN: ``env`` in kernel.json instead of "source set_env.sh, restart JupyterLab".

When a platform (ModelArts, a JupyterHub) starts JupyterLab for you, no shell of yours runs before it, so
``source .../set_env.sh`` cannot reach the kernels. A kernel spec can: Jupyter starts the kernel with the
server's environment updated by the spec's ``env``. This module builds that ``env`` from what a
``set_env.sh`` really changes:

- ``sourced_env(script)``: the environment of ``bash`` before and after ``source script``;
- ``env_diff(before, after)``: the variables the script set or changed. A list variable the script only
  extended (``PATH=/new:$PATH``) keeps a ``${PATH}`` reference, which jupyter_client >= 7 fills from the
  server's environment at kernel start, so the kernel still sees the server's own PATH;
- ``kernel_json(env, python)``: the kernel.json dict; ``from_set_env(script)`` does all three;
- ``install(spec, name, prefix)``: writes ``<prefix>/kernels/<name>/kernel.json`` (the user's Jupyter data
  dir when no prefix is given; a prefix is found by Jupyter when listed in ``JUPYTER_PATH``).

In a terminal: ``python -m nbtools.kernelspec --name cann`` (this machine's CANN set_env.sh: ``cann/`` of
CANN 8.5 and later, or ``ascend-toolkit/``; see device.cann_set_env), or name the script:
``python -m nbtools.kernelspec /usr/local/Ascend/cann/set_env.sh --name cann``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

# Variables bash itself changes between two `env` dumps; never part of what a script sets.
IGNORED = frozenset({"_", "SHLVL", "PWD", "OLDPWD", "BASH_EXECUTION_STRING"})
_SPLIT = "--nbtools-env-split--"


def _parse_env0(blob: str) -> dict[str, str]:
    env = {}
    for item in blob.split("\0"):
        if "=" in item:
            k, v = item.split("=", 1)
            env[k] = v
    return env


def sourced_env(script: str | Path, base: dict | None = None, timeout: float = 60) -> tuple[dict, dict]:
    """(before, after): the environment of one bash before and after ``source script`` (its output kept apart)."""
    script = Path(script)
    if not script.is_file():
        raise FileNotFoundError(f"no such set_env script: {script}")
    prog = f'env -0; printf "\\0{_SPLIT}\\0"; source "$1" 1>&2; rc=$?; env -0; exit $rc'
    proc = subprocess.run(
        ["bash", "-c", prog, "nbtools-kernelspec", str(script)],
        capture_output=True, text=True, env=base, timeout=timeout,
    )
    if proc.returncode != 0 or _SPLIT not in proc.stdout:
        raise RuntimeError(f"`source {script}` failed in bash (exit {proc.returncode}): {proc.stderr.strip()[-500:]}")
    before, after = proc.stdout.split(f"\0{_SPLIT}\0", 1)
    return _parse_env0(before), _parse_env0(after)


def _template_escape(text: str) -> str:
    return text.replace("$", "$$")  # kernel spec env values are string.Template strings


def env_diff(before: dict, after: dict, template: bool = True) -> dict[str, str]:
    """The variables ``after`` sets or changes, as kernel spec ``env`` values.

    ``template=True``: a variable that was set before and was only extended keeps a ``${NAME}`` reference to
    its earlier value (jupyter_client >= 7 substitutes it at kernel start). ``template=False``: full values.
    A list variable that was unset before loses the empty entries ``X:$UNSET`` leaves (an empty entry in PATH
    or LD_LIBRARY_PATH means the current directory). Variables the script unsets cannot be expressed; they
    are left out.
    """
    out = {}
    for name, new in sorted(after.items()):
        if name in IGNORED or before.get(name) == new:
            continue
        old = before.get(name)
        if old is None and name.endswith("PATH") and ":" in new:
            new = ":".join(p for p in new.split(":") if p)
        if not template:
            out[name] = new
        elif old and new.endswith(":" + old):
            out[name] = _template_escape(new[: -len(old)]) + "${" + name + "}"
        elif old and new.startswith(old + ":"):
            out[name] = "${" + name + "}" + _template_escape(new[len(old):])
        else:
            out[name] = _template_escape(new)
    return out


def kernel_json(env: dict, python: str | None = None, display_name: str = "Python (CANN)") -> dict:
    """A kernel.json dict: the given interpreter's ipykernel, started with ``env``."""
    return {
        "argv": [python or sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "env": dict(env),
        "metadata": {"debugger": True},
    }


def from_set_env(script: str | Path, python: str | None = None, display_name: str = "Python (CANN)",
                 template: bool = True, base: dict | None = None) -> dict:
    """kernel.json for ``python`` with the environment ``source script`` produces."""
    before, after = sourced_env(script, base=base)
    return kernel_json(env_diff(before, after, template=template), python=python, display_name=display_name)


def install(spec: dict, name: str, prefix: str | Path | None = None) -> Path:
    """Write ``<prefix or the user's Jupyter data dir>/kernels/<name>/kernel.json``; return its path."""
    if prefix is None:
        from jupyter_core.paths import jupyter_data_dir

        prefix = jupyter_data_dir()
    path = Path(prefix) / "kernels" / name / "kernel.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec, indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m nbtools.kernelspec", description=__doc__.splitlines()[0])
    p.add_argument("set_env", nargs="?", help="the set_env.sh to source (default: this machine's, found as "
                   "device.cann_set_env finds it: /usr/local/Ascend/cann/set_env.sh or .../ascend-toolkit/set_env.sh)")
    p.add_argument("--name", default="cann", help="kernel name (folder name), default: cann")
    p.add_argument("--display-name", default="Python (CANN)")
    p.add_argument("--python", default=sys.executable, help="interpreter the kernel runs (default: this one)")
    p.add_argument("--prefix", help="write under PREFIX/kernels (default: the user's Jupyter data dir)")
    p.add_argument("--full-values", action="store_true", help="no ${VAR} references (jupyter_client < 7)")
    p.add_argument("--print", action="store_true", help="print kernel.json, write nothing")
    args = p.parse_args(argv)
    if args.set_env is None:
        from .device import CANN_INSTALL_INFO, cann_set_env

        args.set_env = cann_set_env()
        if args.set_env is None:
            p.error(f"no CANN set_env.sh found (neither in {CANN_INSTALL_INFO} nor under /usr/local/Ascend): name it")
    spec = from_set_env(args.set_env, python=args.python, display_name=args.display_name,
                        template=not args.full_values)
    if args.print:
        print(json.dumps(spec, indent=1))
        return 0
    path = install(spec, args.name, args.prefix)
    print(f"wrote {path}: restart nothing, pick '{args.display_name}' in Kernel > Change Kernel")
    return 0


if __name__ == "__main__":
    sys.exit(main())
