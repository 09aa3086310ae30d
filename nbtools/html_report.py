"""index.html for a run: the device, the notebooks and every check, linked to the executed
notebooks rendered as HTML with nbconvert.

Everything is self-contained, so the report opens from a CI artifact or a file:// URL on a
machine without network: inline CSS, no script, nothing fetched. nbconvert's 'lab' template
loads require.js, MathJax and mermaid from cdnjs (and the widget renderer from a CDN when
a notebook has widget state); the template below keeps its inlined CSS and drops those
blocks. LaTeX in markdown then shows as source, which these notebooks do not use.
"""

from __future__ import annotations

import html
from pathlib import Path
from urllib.parse import quote

import nbformat

from .checks import check_ids
from .device import device_line
from .model import RunReport, status_counts

INDEX = "index.html"

# nbconvert's 'lab' template without its remote scripts (require.js, MathJax, mermaid, widgets).
OFFLINE_TEMPLATE_NAME = "nbtools_offline.html.j2"
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", "Noto Sans CJK SC", sans-serif;
       margin: 24px auto; max-width: 1200px; padding: 0 16px; color: #1f2328; background: #fff; }
h1 { font-size: 22px; margin: 0 0 12px; }
h2 { font-size: 17px; margin: 28px 0 8px; }
.banner { padding: 10px 14px; border-radius: 6px; font-weight: 600; margin-bottom: 12px; }
.banner.ok { background: #dafbe1; color: #116329; border: 1px solid #4ac26b; }
.banner.bad { background: #ffebe9; color: #a40e26; border: 1px solid #ff8182; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 3px 14px; margin: 0; }
dl.meta dt { color: #59636e; } dl.meta dd { margin: 0; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: 5px 9px; border-bottom: 1px solid #d1d9e0; vertical-align: top; }
th { background: #f6f8fa; font-weight: 600; }
th.num, td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.id, td.nb { white-space: nowrap; font-family: ui-monospace, "SFMono-Regular", Menlo, monospace; font-size: 13px; }
td.reason { word-break: break-word; }
.status { display: inline-block; min-width: 58px; text-align: center; padding: 1px 8px; border-radius: 10px;
          font-weight: 600; font-size: 12px; }
.st-passed .status { background: #dafbe1; color: #116329; }
.st-skipped .status { background: #fff8c5; color: #7d4e00; }
.st-failed .status, .st-missing .status, .st-not-run .status { background: #ffebe9; color: #a40e26; }
tr.st-failed, tr.st-missing, tr.st-not-run { background: #fff5f5; }
.extra { color: #59636e; font-size: 12px; font-family: system-ui, sans-serif; }
.note { color: #59636e; }
.problem { color: #a40e26; }
a { color: #0969da; }
footer { margin-top: 28px; color: #59636e; font-size: 12px; }
"""


def _e(text) -> str:
    return html.escape("" if text is None else str(text), quote=True)


def offline_exporter():
    """An nbconvert HTMLExporter whose pages load nothing from the network."""
    from jinja2 import DictLoader
    from nbconvert import HTMLExporter

    return HTMLExporter(
        template_name="lab",
        template_file=OFFLINE_TEMPLATE_NAME,
        extra_loaders=[DictLoader({OFFLINE_TEMPLATE_NAME: OFFLINE_TEMPLATE})],
    )


def check_anchors(nb) -> dict[str, str]:
    """check id -> the HTML anchor of its assertion cell in the nbconvert page (``cell-id=<id>``)."""
    out = {}
    for cell in nb.cells:
        cell_id = cell.get("id")
        for cid in check_ids(cell.get("metadata", {}).get("tags")):
            if cell_id:
                out.setdefault(cid, f"cell-id={cell_id}")
    return out


def render_notebooks(report: RunReport, output_dir: Path) -> tuple[dict[str, str], dict[str, dict], list[str]]:
    """Write NN_x.html beside each executed notebook.

    Returns (notebook path -> page file name, notebook path -> {check id: anchor}, notes on
    what could not be rendered). A rendering problem never fails the run: the index then
    links the .ipynb instead and says why.
    """
    pages: dict[str, str] = {}
    anchors: dict[str, dict] = {}
    notes: list[str] = []
    executed = [(n, output_dir / n.output) for n in report.notebooks if n.output and (output_dir / n.output).is_file()]
    if not executed:
        return pages, anchors, notes
    try:
        exporter = offline_exporter()
    except Exception as exc:  # ImportError without nbconvert, or a template problem
        notes.append(f"notebook pages not rendered ({type(exc).__name__}: {exc}); pip install nbconvert")
        return pages, anchors, notes
    for n, ipynb in executed:
        page = ipynb.with_suffix(".html")
        try:
            nb = nbformat.read(ipynb, as_version=4)
            anchors[n.path] = check_anchors(nb)
            body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": ipynb.stem}})
            page.write_text(body, encoding="utf-8")
        except Exception as exc:
            notes.append(f"{n.output}: not rendered as HTML ({type(exc).__name__}: {exc})")
            continue
        pages[n.path] = page.name
    return pages, anchors, notes


def _status(status: str) -> str:
    return f'<span class="status">{_e(status)}</span>'


def render_index(
    report: RunReport,
    pages: dict[str, str] | None = None,
    anchors: dict[str, dict] | None = None,
    notes: list[str] | None = None,
) -> str:
    """The index page. ``pages``: notebook path -> rendered page; ``anchors``: check cells in them."""
    pages, anchors, notes = pages or {}, anchors or {}, notes or []
    dev = report.device
    counts = status_counts(report)
    nb_ok = counts["notebooks"].get("passed", 0)
    verdict = report.verdict
    summary = ", ".join(f"{n} {s}" for s, n in counts["checks"].items()) or "none"
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>nbtools run: {verdict}</title>",
        f"<style>{CSS}</style></head><body>",
        "<h1>Notebook series run</h1>",
        f'<div class="banner {"ok" if report.ok else "bad"}" id="result" data-ok="{str(report.ok).lower()}">'
        f"{verdict}: {nb_ok}/{len(report.notebooks)} notebooks passed; checks: {_e(summary)}; "
        f"{report.duration_s:.1f} s</div>",
        '<dl class="meta">',
        f'<dt>device</dt><dd id="device" data-kind="{_e(dev.get("kind"))}" data-count="{_e(dev.get("count"))}">'
        f'{_e(device_line(dev))}; backend {_e(dev.get("backend"))}</dd>',
    ]
    versions = ", ".join(f"{k} {v}" for k, v in (dev.get("versions") or {}).items() if v)
    out.append(f"<dt>versions</dt><dd>{_e(versions)}</dd>")
    if dev.get("visible_var"):
        out.append(f"<dt>visible devices</dt><dd>{_e(dev['visible_var'])}={_e(dev.get('visible_devices') or '')}</dd>")
    for p in dev.get("problems") or []:
        out.append(f'<dt>problem</dt><dd class="problem">{_e(p.get("what"))} (fix: {_e(p.get("fix"))})</dd>')
    out.append(f"<dt>kernel</dt><dd>{_e(report.kernel)}</dd>")
    if report.parameters:
        params = " ".join(f"-p {k}={v}" for k, v in report.parameters.items())
        out.append(f"<dt>parameters</dt><dd>{_e(params)}</dd>")
    out.append(f"<dt>started</dt><dd>{_e(report.started)}</dd>")
    out.append("</dl>")
    for note in notes:
        out.append(f'<p class="note">{_e(note)}</p>')

    out += [
        "<h2>Notebooks</h2>",
        '<table id="notebooks"><thead><tr><th>notebook</th><th>status</th><th class="num">duration (s)</th>'
        "<th>error</th><th>executed</th></tr></thead><tbody>",
    ]
    for n in report.notebooks:
        links = []
        if n.path in pages:
            links.append(f'<a href="{quote(pages[n.path])}">HTML</a>')
        if n.output:
            links.append(f'<a href="{quote(n.output)}">.ipynb</a>')
        if n.kernel_log:
            links.append(f'<a class="kernel-log" href="{quote(n.kernel_log)}">kernel log</a>')
        name = f'<a href="{quote(pages[n.path])}">{_e(n.path)}</a>' if n.path in pages else _e(n.path)
        out.append(
            f'<tr class="st-{_e(n.status)}" data-notebook="{_e(n.path)}" data-status="{_e(n.status)}">'
            f'<td class="nb">{name}</td><td>{_status(n.status)}</td>'
            f'<td class="num duration">{n.duration_s:.1f}</td><td class="reason">{_e(n.error)}</td>'
            f'<td>{" · ".join(links)}</td></tr>'
        )
    out.append("</tbody></table>")

    out += [
        "<h2>Checks</h2>",
        '<table id="checks"><thead><tr><th>check</th><th>status</th><th>notebook</th>'
        "<th>reason / detail</th></tr></thead><tbody>",
    ]
    for c in report.checks:
        page = pages.get(c.notebook)
        anchor = (anchors.get(c.notebook) or {}).get(c.id)
        ident = _e(c.id)
        if page:
            ident = f'<a href="{quote(page)}{"#" + quote(anchor, safe="=-") if anchor else ""}">{ident}</a>'
        extra = "" if c.seed else ' <span class="extra">extra</span>'
        out.append(
            f'<tr class="st-{_e(c.status)}" data-check="{_e(c.id)}" data-status="{_e(c.status)}" '
            f'data-seed="{str(c.seed).lower()}">'
            f'<td class="id">{ident}{extra}</td><td>{_status(c.status)}</td>'
            f'<td class="nb">{_e(c.notebook)}</td><td class="reason">{_e(c.reason)}</td></tr>'
        )
    out.append("</tbody></table>")
    out.append(
        "<footer>Written by <code>python -m nbtools run</code>; also in this folder: report.json, report.md, "
        "junit.xml, the executed notebooks and each kernel's own log (NN_x.kernel.log).</footer>"
    )
    out.append("</body></html>")
    return "\n".join(out) + "\n"


def write_html(report: RunReport, output_dir: Path, *, notebook_pages: bool = True) -> list[Path]:
    """Write index.html (and, with ``notebook_pages``, NN_x.html per executed notebook) into output_dir.

    Returns [index.html, the notebook pages...].
    """
    output_dir = Path(output_dir)
    pages, anchors, notes = render_notebooks(report, output_dir) if notebook_pages else ({}, {}, [])
    index = output_dir / INDEX
    index.write_text(render_index(report, pages, anchors, notes), encoding="utf-8")
    return [index, *(output_dir / p for p in pages.values())]
