"""Write a run's report: report.json, report.md, junit.xml and index.html (html_report.py) in the output dir.

``status_counts`` is the one place the counts are made: report.json's summary, junit.xml's
totals, index.html's banner and the CLI's last line all read them from there.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict
from pathlib import Path
from urllib.parse import quote
from xml.etree import ElementTree as ET

import jinja2

from .commands import shown
from .device import device_line
from .model import RunReport, status_counts, strip_ansi

# Characters XML 1.0 does not allow, even escaped: C0 controls but tab/LF/CR, surrogates, U+FFFE/U+FFFF.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def counted(counts: dict) -> str:
    """'11 passed, 1 skipped' of {"passed": 11, "skipped": 1}; '' when empty."""
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def summary_line(report: RunReport, counts: dict | None = None) -> str:
    """'PASSED: 11 passed, 1 skipped checks; 7/7 notebooks passed in 312.4 s' (the CLI's last line)."""
    counts = counts or status_counts(report)
    verdict = report.verdict
    checks = counted(counts["checks"]) or "no"
    passed = counts["notebooks"].get("passed", 0)
    return (
        f"{verdict}: {checks} checks; {passed}/{len(report.notebooks)} notebooks passed in {report.duration_s:.1f} s"
    )


def to_dict(report: RunReport) -> dict:
    d = asdict(report)
    counts = status_counts(report)
    d["summary"] = {
        "ok": report.ok,
        "checks": counts["checks"],
        "notebooks": len(report.notebooks),
        "notebook_statuses": counts["notebooks"],
        "junit": counts["junit"],
    }
    return d


def write_json(report: RunReport, path: Path) -> None:
    path.write_text(json.dumps(to_dict(report), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def xml_text(text) -> str:
    """Text that XML 1.0 can hold: terminal escapes removed, forbidden control characters dropped
    (a form feed, a NUL, a bell), everything else kept as is."""
    return _NOT_XML.sub("", strip_ansi(str(text)))


def _cell(text) -> str:
    """Text for one markdown table cell: XML-safe, no pipe or newline to break the row."""
    return xml_text(text).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


# templates/index.html.j2 (html_report.py) and templates/report.md.j2; only the HTML one is autoescaped.
TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("nbtools", "templates"),
    autoescape=jinja2.select_autoescape(["html.j2"]),
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    finalize=lambda value: "" if value is None else value,  # a missing value shows as nothing, not 'None'
)
TEMPLATES.filters.update(cell=_cell, counted=counted, url=lambda text, safe="/": quote(str(text), safe=safe))


def parameters_line(parameters: dict) -> str:
    """The run's ``-p NAME=VALUE`` options, quoted as a shell takes them back (both reports show this)."""
    return shown([word for name, value in parameters.items() for word in ("-p", f"{name}={value}")])


def context(report: RunReport) -> dict:
    """What both report templates read: the report, its device and the lines made from them."""
    dev, counts = report.device, status_counts(report)
    return {
        "report": report,
        "dev": dev,
        "device": device_line(dev),
        "versions": ", ".join(f"{k} {v}" for k, v in (dev.get("versions") or {}).items() if v),
        "parameters": parameters_line(report.parameters),
        "counts": counts,
        "summary": summary_line(report, counts),
    }


def render_markdown(report: RunReport) -> str:
    return TEMPLATES.get_template("report.md.j2").render(context(report))


def write_junit(report: RunReport, path: Path) -> None:
    suite = ET.Element("testsuite", name="nbtools", time=f"{report.duration_s:.2f}")
    props = ET.SubElement(suite, "properties")  # which device the verdicts hold for ("NPU (simulated on CPU) ...")
    ET.SubElement(props, "property", name="device", value=xml_text(device_line(report.device)))
    for n in report.notebooks:
        case = ET.SubElement(suite, "testcase", classname="notebooks", name=xml_text(n.path), time=f"{n.duration_s:.2f}")
        if n.status != "passed":
            ET.SubElement(case, "failure", message=xml_text(n.error or n.status)).text = xml_text(n.error or n.status)
    for c in report.checks:
        case = ET.SubElement(suite, "testcase", classname=f"checks.{c.notebook or 'unclaimed'}", name=xml_text(c.id))
        if c.status in ("failed", "missing"):
            ET.SubElement(case, "failure", message=xml_text(f"{c.status}: {c.reason}"))
        elif c.status == "skipped":
            ET.SubElement(case, "skipped", message=xml_text(c.reason))
    totals = status_counts(report)["junit"]
    suite.set("tests", str(totals["tests"]))
    suite.set("failures", str(totals["failures"]))
    suite.set("skipped", str(totals["skipped"]))
    suite.set("errors", "0")
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def write_all(report: RunReport, output_dir: Path) -> list[Path]:
    from .html_report import write_html

    paths = [output_dir / "report.json", output_dir / "report.md", output_dir / "junit.xml"]
    write_json(report, paths[0])
    paths[1].write_text(render_markdown(report), encoding="utf-8")
    write_junit(report, paths[2])
    paths.append(write_html(report, output_dir)[0])  # index.html; the notebook pages sit beside it
    return paths
