"""Write a run's report: report.json, report.md, junit.xml and index.html in the output dir.

``status_counts`` is the one place the counts are made: report.json's summary, junit.xml's
totals, index.html's banner and the CLI's last line all read them from there.

index.html for a run (templates/index.html.j2, autoescaped): the device, the notebooks and every
check, linked to the executed notebooks rendered as HTML with nbconvert.

Everything is self-contained, so the report opens from a CI artifact or a file:// URL on a
machine without network: inline CSS, no script, nothing fetched. nbconvert's 'lab' template
loads require.js, MathJax and mermaid from cdnjs (and the widget renderer from a CDN when
a notebook has widget state); templates/nbtools_offline.html.j2 keeps its inlined CSS and drops
those blocks. LaTeX in markdown then shows as source, which these notebooks do not use.

The data model they write (RunReport and its parts) is run_results.py's: runner.py fills it, this module writes it out.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from urllib.parse import quote
from xml.etree import ElementTree as ET

import jinja2
import nbformat

from .checks import Status, check_ids, strip_ansi
from .commands import shell_line
from .device import device_line
from .run_results import RunReport, status_counts
from .versions import installed

# Characters XML 1.0 does not allow, even escaped: C0 controls but tab/LF/CR, surrogates, U+FFFE/U+FFFF.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def counted(counts: dict) -> str:
    """'11 passed, 1 skipped' of {"passed": 11, "skipped": 1}; '' when empty."""
    return ", ".join(f"{n} {s}" for s, n in counts.items())


def summary_line(report: RunReport) -> str:
    """'PASSED: 11 passed, 1 skipped checks; 7/7 notebooks passed in 312.4 s' (the CLI's last line)."""
    counts = status_counts(report)
    checks = counted(counts["checks"]) or "no"
    passed = counts["notebooks"].get(Status.PASSED, 0)
    simulated = " on the simulated NPU (code paths and wiring, not the hardware)" if report.device.get("simulated") else ""
    return (f"{report.verdict}: {checks} checks; {passed}/{len(report.notebooks)} notebooks passed in "
            f"{report.duration_s:.1f} s{simulated}")


def verdict_table(report: RunReport, output_dir: Path) -> str:
    """The job log's verdict (Ascend's examples guard keeps only the log and the exit status): every check with
    its status and reason, failed ones last, each notebook that did not pass, the device, the versions, and
    report.json's path."""
    rows = [(c.status, c.id, c.notebook, c.reason) for c in report.checks]
    rows = sorted(rows, key=lambda r: not Status(r[0]).ok) + [
        (n.status, "(notebook)", n.path, n.error) for n in report.notebooks if not Status(n.status).ok]
    width = max([5] + [len(r[1]) for r in rows])
    lines = [f"{'status':<8}  {'check':<{width}}  notebook: reason"]
    lines += [f"{s:<8}  {i:<{width}}  {nb or '-'}: {' / '.join(str(why).splitlines())}" for s, i, nb, why in rows]
    ctx, where = context(report), f"report.json: {(output_dir / 'report.json').resolve()}"
    return "\n".join([*lines, f"device: {ctx['device']}", f"versions: {ctx['versions']}",
                      f"{where} (under Ascend's examples guard only this log and the exit status come back)"])


def to_dict(report: RunReport) -> dict:
    counts = status_counts(report)
    return {**asdict(report), "summary": {"ok": report.ok, "checks": counts["checks"], "notebooks": len(report.notebooks),
                                          "notebook_statuses": counts["notebooks"], "junit": counts["junit"]}}


def xml_text(text) -> str:
    """Text that XML 1.0 can hold: terminal escapes removed, forbidden control characters dropped
    (a form feed, a NUL, a bell), everything else kept as is."""
    return _NOT_XML.sub("", strip_ansi(str(text)))


def _cell(text) -> str:
    """Text for one markdown table cell: XML-safe, no pipe or newline to break the row."""
    return xml_text(text).replace("|", "\\|").replace("\r", " ").replace("\n", " ")


# templates/index.html.j2 and templates/report.md.j2; only the HTML one is autoescaped.
TEMPLATES = jinja2.Environment(  # finalize: a missing value shows as nothing, not 'None'
    loader=jinja2.PackageLoader("nbtools", "templates"), autoescape=jinja2.select_autoescape(["html.j2"]),
    trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, finalize=lambda v: "" if v is None else v)
TEMPLATES.filters.update(cell=_cell, counted=counted, url=lambda text, safe="/": quote(str(text), safe=safe))


def context(report: RunReport) -> dict:
    """What both report templates read: the report, its device and the lines made from them (``parameters``: the
    run's ``-p NAME=VALUE`` options, quoted as a shell takes them back)."""
    dev, counts = report.device, status_counts(report)
    options = [word for name, value in report.parameters.items() for word in ("-p", f"{name}={value}")]
    return {"report": report, "dev": dev, "device": device_line(dev), "counts": counts, "statuses": list(Status),
            "versions": ", ".join(f"{k} {v}" for k, v in (dev.get("versions") or {}).items() if v),
            "parameters": shell_line(options), "summary": summary_line(report)}


def write_junit(report: RunReport, path: Path) -> None:
    sim = "simulated_npu." if report.device.get("simulated") else ""  # every testcase says it, not only the suite
    suite = ET.Element("testsuite", name=f"nbtools{' (NPU simulated on CPU)' if sim else ''}", time=f"{report.duration_s:.2f}")
    props = ET.SubElement(suite, "properties")  # which device the verdicts hold for ("NPU (simulated on CPU) ...")
    ET.SubElement(props, "property", name="device", value=xml_text(device_line(report.device)))
    for n in report.notebooks:
        case = ET.SubElement(suite, "testcase", classname=f"{sim}notebooks", name=xml_text(n.path), time=f"{n.duration_s:.2f}")
        if not Status(n.status).ok:  # the rule of run_results.failures
            ET.SubElement(case, "failure", message=xml_text(n.error or n.status)).text = xml_text(n.error or n.status)
    for c in report.checks:
        case = ET.SubElement(suite, "testcase", classname=f"{sim}checks.{c.notebook or 'unclaimed'}", name=xml_text(c.id))
        if not Status(c.status).ok:
            ET.SubElement(case, "failure", message=xml_text(f"{c.status}: {c.reason}"))
        elif c.status == Status.SKIPPED:
            ET.SubElement(case, Status.SKIPPED, message=xml_text(c.reason))
    for key, n in status_counts(report)["junit"].items():  # tests, failures, skipped
        suite.set(key, str(n))
    suite.set("errors", "0")
    ET.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


UNKNOWN = {"target_repo": "unknown/unknown"}


def result_record(report: RunReport, environ=os.environ) -> dict:
    """result.json: the six fields of Ascend's examples-guard result (its result.schema.json), then what ran. A field
    comes from RESULT_<FIELD> (RESULT_IMAGE, ...), else GitHub's own variable, else it says "unknown" (target_repo:
    "unknown/unknown", the schema's owner/name shape), never a guess."""
    def given(field: str, github: str = "") -> str:
        return environ.get(f"RESULT_{field.upper()}") or environ.get(github) or UNKNOWN.get(field, "unknown")

    dev, counts = report.device, status_counts(report)
    return {"trigger": given("trigger", "GITHUB_EVENT_NAME"), "target_repo": given("target_repo", "GITHUB_REPOSITORY"),
            "target_ref": given("target_ref", "GITHUB_SHA"), "image": given("image"),
            "path": environ.get("RESULT_PATH") or " ".join(n.path for n in report.notebooks),
            "job_status": "cancelled" if report.stopped_by else "success" if report.ok else "failure",
            "source": environ.get("RESULT_SOURCE") or "upstream",
            "device": {k: dev.get(k) for k in ("kind", "count", "names", "simulated")},
            "versions": {**(dev.get("versions") or {}), "peft": installed("peft"), "deepspeed": installed("deepspeed")},
            "checks": counts["checks"], "notebooks": counts["notebooks"]}


def write_all(report: RunReport, output_dir: Path) -> list[Path]:
    paths = [output_dir / name for name in ("report.json", "report.md", "junit.xml", "result.json")]
    for path, record in ((paths[0], to_dict(report)), (paths[3], result_record(report))):
        path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    paths[1].write_text(TEMPLATES.get_template("report.md.j2").render(context(report)), encoding="utf-8")
    write_junit(report, paths[2])
    paths.append(write_html(report, output_dir)[0])  # index.html; the notebook pages sit beside it
    return paths


def offline_exporter():
    """An nbconvert HTMLExporter whose pages load nothing from the network (templates/nbtools_offline.html.j2: the
    'lab' template without its remote scripts: require.js, MathJax, mermaid, widgets)."""
    from nbconvert import HTMLExporter

    return HTMLExporter(template_name="lab", template_file=str(Path(__file__).with_name("templates") / "nbtools_offline.html.j2"))


def render_index(report: RunReport, pages: dict[str, str] | None = None, anchors: dict[str, dict] | None = None,
                 notes: list[str] | None = None) -> str:
    """The index page (templates/index.html.j2). ``pages``: notebook path -> rendered page; ``anchors``: check
    cells in them; ``notes``: what could not be rendered."""
    template = TEMPLATES.get_template("index.html.j2")
    return template.render(context(report), pages=pages or {}, anchors=anchors or {}, notes=notes or [])


def write_html(report: RunReport, output_dir: Path) -> list[Path]:
    """Write index.html and NN_x.html beside each executed notebook into output_dir; returns [index.html, the notebook
    pages...]. A rendering problem never fails the run: the index then links the .ipynb instead and says why."""
    output_dir, pages, anchors, notes = Path(output_dir), {}, {}, []
    executed = [(n, output_dir / n.output) for n in report.notebooks if n.output and (output_dir / n.output).is_file()]
    try:
        exporter = offline_exporter() if executed else None
    except Exception as exc:  # ImportError without nbconvert, or a template problem
        notes.append(f"notebook pages not rendered ({type(exc).__name__}: {exc}); pip install nbconvert")
        executed = []
    for n, ipynb in executed:
        page = ipynb.with_suffix(".html")
        try:
            nb = nbformat.read(ipynb, as_version=4)  # each check's anchor: its (first) cell in the page, cell-id=<id>
            anchors[n.path] = {cid: f"cell-id={cell.id}" for cell in reversed(nb.cells) if cell.get("id")
                               for cid in check_ids(cell.get("metadata", {}).get("tags"))}
            body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": ipynb.stem}})
            page.write_text(body, encoding="utf-8")
        except Exception as exc:
            notes.append(f"{n.output}: not rendered as HTML ({type(exc).__name__}: {exc})")
            continue
        pages[n.path] = page.name
    index = output_dir / "index.html"
    index.write_text(render_index(report, pages, anchors, notes), encoding="utf-8")
    return [index, *(output_dir / p for p in pages.values())]
