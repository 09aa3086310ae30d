"""index.html for a run (templates/index.html.j2, autoescaped): the device, the notebooks and every
check, linked to the executed notebooks rendered as HTML with nbconvert.

Everything is self-contained, so the report opens from a CI artifact or a file:// URL on a
machine without network: inline CSS, no script, nothing fetched. nbconvert's 'lab' template
loads require.js, MathJax and mermaid from cdnjs (and the widget renderer from a CDN when
a notebook has widget state); the template below keeps its inlined CSS and drops those
blocks. LaTeX in markdown then shows as source, which these notebooks do not use.
"""

from __future__ import annotations

from pathlib import Path

import nbformat

from .checks import check_ids
from .model import RunReport
from .report import TEMPLATES, context

INDEX = "index.html"

# nbconvert's 'lab' template without its remote scripts (require.js, MathJax, mermaid, widgets).
OFFLINE_TEMPLATE_NAME = "nbtools_offline.html.j2"
OFFLINE_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block jupyter_widgets -%}{%- endblock jupyter_widgets -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
"""


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


def render_index(
    report: RunReport,
    pages: dict[str, str] | None = None,
    anchors: dict[str, dict] | None = None,
    notes: list[str] | None = None,
) -> str:
    """The index page (templates/index.html.j2). ``pages``: notebook path -> rendered page; ``anchors``: check
    cells in them; ``notes``: what could not be rendered."""
    template = TEMPLATES.get_template("index.html.j2")
    return template.render(context(report), pages=pages or {}, anchors=anchors or {}, notes=notes or [])


def write_html(report: RunReport, output_dir: Path, *, notebook_pages: bool = True) -> list[Path]:
    """Write index.html (and, with ``notebook_pages``, NN_x.html per executed notebook) into output_dir.

    Returns [index.html, the notebook pages...].
    """
    output_dir = Path(output_dir)
    pages, anchors, notes = render_notebooks(report, output_dir) if notebook_pages else ({}, {}, [])
    index = output_dir / INDEX
    index.write_text(render_index(report, pages, anchors, notes), encoding="utf-8")
    return [index, *(output_dir / p for p in pages.values())]
