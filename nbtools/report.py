"""Write a run's report: report.json, report.md, junit.xml and index.html (html_report.py) in the output dir."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from xml.etree import ElementTree as ET

from .html_report import write_html
from .runner import RunReport


def to_dict(report: RunReport) -> dict:
    d = asdict(report)
    counts: dict[str, int] = {}
    for c in report.checks:
        counts[c.status] = counts.get(c.status, 0) + 1
    d["summary"] = {"ok": report.ok, "checks": counts, "notebooks": len(report.notebooks)}
    return d


def write_json(report: RunReport, path: Path) -> None:
    path.write_text(json.dumps(to_dict(report), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def _esc(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def render_markdown(report: RunReport) -> str:
    dev = report.device
    name = f"{dev['kind'].upper()} x{dev['count']}" if dev["kind"] != "cpu" else "CPU only"
    lines = [
        "# Notebook series run",
        "",
        f"- result: **{'PASSED' if report.ok else 'FAILED'}** in {report.duration_s:.1f} s (started {report.started})",
        f"- device: {name} {', '.join(sorted(set(dev.get('names') or [])))}; backend {dev['backend']}",
        "- versions: " + ", ".join(f"{k} {v}" for k, v in dev["versions"].items() if v),
    ]
    for p in dev.get("problems") or []:
        lines.append(f"- problem: {p['what']} (fix: {p['fix']})")
    if report.parameters:
        lines.append("- parameters: " + ", ".join(f"{k}={v!r}" for k, v in report.parameters.items()))
    lines += ["", "## Notebooks", "", "| notebook | status | duration (s) | error |", "|---|---|---|---|"]
    for n in report.notebooks:
        lines.append(f"| {n.path} | {n.status} | {n.duration_s:.1f} | {_esc(n.error)} |")
    lines += ["", "## Checks", "", "| id | status | notebook | reason / detail |", "|---|---|---|---|"]
    for c in report.checks:
        cid = c.id if c.seed else f"{c.id} (extra)"
        lines.append(f"| {cid} | {c.status} | {c.notebook} | {_esc(c.reason)} |")
    return "\n".join(lines) + "\n"


def write_junit(report: RunReport, path: Path) -> None:
    suite = ET.Element("testsuite", name="nbtools", time=f"{report.duration_s:.2f}")
    failures = skipped = 0
    for n in report.notebooks:
        case = ET.SubElement(suite, "testcase", classname="notebooks", name=n.path, time=f"{n.duration_s:.2f}")
        if n.status != "passed":
            failures += 1
            ET.SubElement(case, "failure", message=n.error or n.status)
    for c in report.checks:
        case = ET.SubElement(suite, "testcase", classname=f"checks.{c.notebook or 'unclaimed'}", name=c.id)
        if c.status in ("failed", "missing"):
            failures += 1
            ET.SubElement(case, "failure", message=f"{c.status}: {c.reason}")
        elif c.status == "skipped":
            skipped += 1
            ET.SubElement(case, "skipped", message=c.reason)
    suite.set("tests", str(len(suite)))
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    suite.set("errors", "0")
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def write_all(report: RunReport, output_dir: Path) -> list[Path]:
    paths = [output_dir / "report.json", output_dir / "report.md", output_dir / "junit.xml"]
    write_json(report, paths[0])
    paths[1].write_text(render_markdown(report), encoding="utf-8")
    write_junit(report, paths[2])
    paths.append(write_html(report, output_dir)[0])  # index.html; the notebook pages sit beside it
    return paths
