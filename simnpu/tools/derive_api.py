#!/usr/bin/env python3
"""Derive the names (and function signatures) the REAL torch_npu wheel offers.

The real wheel cannot be imported without CANN, so its Python sources are read with ``ast``,
never imported. The result, ``simnpu/api/torch_npu-<version>.json``, is the list of names the
simulated ``torch_npu`` may define: tests fail when the stand-in offers a name the real wheel
lacks, or a function whose parameters differ from the real one.

Usage::

    python simnpu/tools/derive_api.py                 # pip download the wheel, write the json
    python simnpu/tools/derive_api.py --wheel X.whl   # use a wheel already on disk
    python simnpu/tools/derive_api.py --out -         # print instead of writing
    python simnpu/tools/derive_api.py --version 2.14.0   # another release (its own json beside)

What is recorded, per module (``torch_npu``, ``torch.npu`` = ``torch_npu/npu/__init__.py``,
and a few submodules of it): its literal ``__all__`` (``names``), the ``__init__`` parameters of the
classes it defines (``init``), every name its top level binds (``def``, ``class``, assignments,
``import`` / ``from ... import`` incl. ``*``, names in a literal ``__all__``), every direct
submodule of the package (importing ``torch_npu.x.y`` anywhere binds ``x`` on the package), and
for ``torch_npu`` the NPU operators it copies from ``torch.ops.npu`` at import time (kind ``op``: the literal
``public_npu_functions`` list, and every operator of the ``custom:`` sections of the wheel's
``npu_native_functions*.yaml``, with its ``schema``).
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile

VERSION = "2.9.0.post2"
HERE = os.path.dirname(os.path.abspath(__file__))


def default_out(version: str) -> str:
    return os.path.join(os.path.dirname(HERE), "api", f"torch_npu-{version}.json")

# (name the user sees, dotted module inside the wheel)
MODULES = [
    ("torch_npu", "torch_npu"),
    ("torch.npu", "torch_npu.npu"),
    ("torch.npu.amp", "torch_npu.npu.amp"),
    ("torch.npu.random", "torch_npu.npu.random"),
    ("torch.npu.memory", "torch_npu.npu.memory"),
    ("torch.npu.utils", "torch_npu.npu.utils"),
]


def download_wheel(dest: str, version: str = VERSION) -> str:
    """pip download the wheel for this interpreter's tag (any tag works: the .py files are the same)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet",
           f"torch-npu=={version}", "-d", dest]
    subprocess.run(cmd, check=True)
    wheels = [f for f in os.listdir(dest) if f.endswith(".whl")]
    if not wheels:
        raise RuntimeError(f"pip download produced no wheel in {dest}")
    return os.path.join(dest, wheels[0])


class Wheel:
    def __init__(self, path: str):
        self.path = path
        self.sources: dict[str, str] = {}   # dotted module -> source
        self.packages: set[str] = set()
        with zipfile.ZipFile(path) as z:
            for name in z.namelist():
                if not name.endswith(".py") or not name.startswith("torch_npu/"):
                    continue
                parts = name[:-3].split("/")
                if parts[-1] == "__init__":
                    parts = parts[:-1]
                    self.packages.add(".".join(parts))
                self.sources[".".join(parts)] = z.read(name).decode("utf-8", "replace")
        self._cache: dict[str, dict] = {}

    def submodules(self, pkg: str) -> list[str]:
        out = set()
        prefix = pkg + "."
        for mod in self.sources:
            if mod.startswith(prefix):
                out.add(mod[len(prefix):].split(".")[0])
        # compiled extension modules (e.g. torch_npu._C) are submodules too
        with zipfile.ZipFile(self.path) as z:
            base = pkg.replace(".", "/") + "/"
            for name in z.namelist():
                if name.startswith(base) and name.endswith(".so"):
                    rest = name[len(base):]
                    if "/" not in rest:
                        out.add(rest.split(".")[0])
        return sorted(out)

    def resolve_relative(self, module: str, level: int, target: str | None) -> str:
        if level == 0:
            return target or ""
        base = module if module in self.packages else module.rsplit(".", 1)[0]
        for _ in range(level - 1):
            base = base.rsplit(".", 1)[0]
        return f"{base}.{target}" if target else base

    def bindings(self, module: str, depth: int = 0) -> dict:
        """name -> entry for everything the module's top level binds."""
        if module in self._cache:
            return self._cache[module]
        self._cache[module] = {}
        src = self.sources.get(module)
        if src is None or depth > 12:
            return {}
        tree = ast.parse(src)
        out: dict[str, dict] = {}
        all_names: list[str] = []

        def visit(stmts):
            for node in stmts:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    out[node.name] = {"kind": "function", "signature": signature(node.args),
                                      "source": module}
                elif isinstance(node, ast.ClassDef):
                    out[node.name] = {"kind": "class", "source": module}
                    init = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "__init__"), None)
                    if init is not None:  # the parameters a caller passes (self dropped)
                        out[node.name]["init"] = signature(init.args)[1:]
                elif isinstance(node, ast.Import):
                    for a in node.names:
                        if a.asname:
                            out[a.asname] = {"kind": "module", "source": a.name}
                        else:
                            top = a.name.split(".")[0]
                            out[top] = {"kind": "module", "source": top}
                elif isinstance(node, ast.ImportFrom):
                    src_mod = self.resolve_relative(module, node.level, node.module)
                    for a in node.names:
                        if a.name == "*":
                            for n, e in self.public_of(src_mod, depth + 1).items():
                                out[n] = e
                            continue
                        out[a.asname or a.name] = self.lookup(src_mod, a.name, depth + 1)
                elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for t in targets:
                        for n in ast.walk(t):
                            if isinstance(n, ast.Name):
                                if n.id == "__all__":
                                    all_names.extend(literal_strings(node.value))
                                else:
                                    out.setdefault(n.id, {"kind": "value", "source": module})
                elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
                    f = node.value.func   # __all__.append("x") / __all__.extend([...])
                    if (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                            and f.value.id == "__all__" and f.attr in ("append", "extend")):
                        for arg in node.value.args:
                            all_names.extend(literal_strings(arg))
                elif isinstance(node, (ast.If, ast.Try, ast.With)):
                    visit(node.body)
                    visit(getattr(node, "orelse", []))
                    visit(getattr(node, "finalbody", []))
                    for h in getattr(node, "handlers", []):
                        visit(h.body)
                elif isinstance(node, ast.For):
                    for n in ast.walk(node.target):
                        if isinstance(n, ast.Name):
                            out.setdefault(n.id, {"kind": "value", "source": module})
        visit(tree.body)
        if module in self.packages:
            for sub in self.submodules(module):
                out.setdefault(sub, {"kind": "module", "source": f"{module}.{sub}"})
        for n in all_names:
            out.setdefault(n, {"kind": "value", "source": module})
        out["__all__"] = {"kind": "value", "source": module, "names": sorted(set(all_names))} \
            if all_names else out.get("__all__", {"kind": "value", "source": module})
        if not all_names:
            out.pop("__all__")
        self._cache[module] = out
        return out

    def public_of(self, module: str, depth: int) -> dict:
        """What ``from module import *`` binds."""
        b = self.bindings(module, depth)
        if "__all__" in b and b["__all__"].get("names"):
            return {n: b.get(n, {"kind": "value", "source": module}) for n in b["__all__"]["names"]}
        return {n: e for n, e in b.items() if not n.startswith("_")}

    def lookup(self, module: str, name: str, depth: int) -> dict:
        if module not in self.sources:
            sub = f"{module}.{name}"
            if sub in self.sources:
                return {"kind": "module", "source": sub}
            return {"kind": "external", "source": f"{module}.{name}"}
        b = self.bindings(module, depth)
        if name in b:
            return b[name]
        if f"{module}.{name}" in self.sources:
            return {"kind": "module", "source": f"{module}.{name}"}
        return {"kind": "value", "source": module}


def literal_strings(node) -> list[str]:
    try:
        v = ast.literal_eval(node)
    except Exception:
        return []
    if isinstance(v, str):
        return [v]
    if isinstance(v, (list, tuple)):
        return [x for x in v if isinstance(x, str)]
    return []


def signature(args: ast.arguments) -> list[dict]:
    params = []
    pos = list(args.posonlyargs) + list(args.args)
    defaults = [None] * (len(pos) - len(args.defaults)) + list(args.defaults)
    for i, (a, d) in enumerate(zip(pos, defaults)):
        kind = "POSITIONAL_ONLY" if i < len(args.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        params.append({"name": a.arg, "kind": kind, "default": None if d is None else ast.unparse(d)})
    if args.vararg:
        params.append({"name": args.vararg.arg, "kind": "VAR_POSITIONAL", "default": None})
    for a, d in zip(args.kwonlyargs, args.kw_defaults):
        params.append({"name": a.arg, "kind": "KEYWORD_ONLY", "default": None if d is None else ast.unparse(d)})
    if args.kwarg:
        params.append({"name": args.kwarg.arg, "kind": "VAR_KEYWORD", "default": None})
    return params


YAMLS = ("torch_npu/csrc/aten/npu_native_functions.yaml", "torch_npu/csrc/aten/npu_native_functions_by_codegen.yaml")


def npu_operators(wheel_path: str) -> dict[str, str]:
    """name -> schema of the operators the wheel registers in the ``npu`` namespace (the yamls' ``custom:``
    sections; read line by line, no yaml parser needed)."""
    ops: dict[str, str] = {}
    with zipfile.ZipFile(wheel_path) as z:
        for path in YAMLS:
            section = None
            for line in z.read(path).decode("utf-8", "replace").splitlines():
                if line and not line[0].isspace() and not line.startswith("-"):
                    section = line.split(":")[0]
                    continue
                stripped = line.strip().removeprefix("- ")
                if section == "custom" and stripped.startswith("func: "):
                    schema = stripped[len("func: "):]
                    full, name = schema.split("(")[0], schema.split("(")[0].split(".")[0]
                    if name not in ops or full == name:   # the default overload wins
                        ops[name] = schema
    return ops


LATE_EXPORTS = "torch_npu._init.core._exports"   # 2.14.0: torch_npu's public names are set at import, not bound


def late_exports(w: Wheel) -> dict[str, dict]:
    """What 2.14.0's ``_export_public_apis()`` sets on torch_npu: the ``_LAZY_PYTHON_SYMBOLS`` (name -> the function
    it resolves to), the module ``__getattr__`` / ``__dir__`` that serve them, and the names it assigns literally
    into ``globals_dict`` (``ParallelStore``, ``_ShardedGradScaler``)."""
    if LATE_EXPORTS not in w.sources:
        return {}
    out: dict[str, dict] = {"__getattr__": {"kind": "function", "signature": [
        {"name": "name", "kind": "POSITIONAL_OR_KEYWORD", "default": None}]}, "__dir__": {"kind": "function", "signature": []}}
    for node in ast.walk(ast.parse(w.sources[LATE_EXPORTS])):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "_LAZY_PYTHON_SYMBOLS":
            for name, (mod, attr) in ast.literal_eval(node.value).items():
                out[name] = w.lookup(mod, attr, 1)
        elif (isinstance(node, ast.Subscript) and getattr(node.value, "id", "") == "globals_dict"
              and isinstance(node.slice, ast.Constant) and isinstance(node.ctx, ast.Store)):
            out.setdefault(node.slice.value, {"kind": "value"})
    return out


def derive(wheel_path: str, version: str = VERSION) -> dict:
    w = Wheel(wheel_path)
    modules = {}
    for shown, dotted in MODULES:
        names = {}
        for n, e in sorted(w.bindings(dotted).items()):
            entry = {"kind": e["kind"]}
            if e["kind"] == "function":
                entry["signature"] = e["signature"]
            if e["kind"] == "class" and "init" in e:
                entry["init"] = e["init"]
            if n == "__all__" and e.get("names"):
                entry["names"] = e["names"]
            names[n] = entry
        modules[shown] = names
    for n, e in late_exports(w).items():
        modules["torch_npu"][n] = {k: v for k, v in e.items() if k in ("kind", "signature")}
    # torch_npu copies every torch.ops.npu operator onto itself at import (a loop over
    # dir(torch.ops.npu)); the public ones are listed literally in utils/exposed_api.py.
    exposed = w.bindings("torch_npu.utils.exposed_api")
    tree = ast.parse(w.sources["torch_npu.utils.exposed_api"])
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "public_npu_functions" for t in node.targets):
            for op in literal_strings(node.value):
                modules["torch_npu"].setdefault(op, {"kind": "op"})
    del exposed
    # ... and every other torch.ops.npu operator too (the loop binds them all, public or not): the `custom` section
    # of the wheel's native-function yamls, each with its schema (the default overload's, else the first)
    for op, schema in sorted(npu_operators(wheel_path).items()):
        modules["torch_npu"].setdefault(op, {"kind": "op"})["schema"] = schema
    with open(wheel_path, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return {
        "about": "Names the real torch_npu wheel binds, read from its sources with ast "
                 "(simnpu/tools/derive_api.py). The simulated torch_npu may only define these.",
        "version": version,
        "wheel": os.path.basename(wheel_path),
        "wheel_sha256": sha,
        "modules": modules,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--version", default=VERSION, help=f"the release (default {VERSION}; also 2.14.0)")
    p.add_argument("--wheel", help="path to torch_npu-<version>-*.whl (default: pip download it)")
    p.add_argument("--out", help="json to write (default simnpu/api/torch_npu-<version>.json), '-' for stdout")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        wheel = a.wheel or download_wheel(tmp, a.version)
        data = derive(wheel, a.version)
    a.out = a.out or default_out(a.version)
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    if a.out == "-":
        sys.stdout.write(text)
    else:
        os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
        with open(a.out, "w") as f:
            f.write(text)
        n = sum(len(v) for v in data["modules"].values())
        print(f"wrote {a.out}: {n} names in {len(data['modules'])} modules")
    return 0


if __name__ == "__main__":
    sys.exit(main())
