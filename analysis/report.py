"""One self-contained report of every claim: verdicts, fits, figures and provenance.

Reads results files only: every ``*.nc`` file of the results folder, whatever its name (a run
saved with ``sfxlin run --name``), matched to its analysis by its ``experiment`` attr. A file
that cannot be read or analysed (damaged, of another schema, another tool's) is skipped with a
line saying which and why, and listed in the report; the report fails only when no file is
usable. A file names its own analysis module (``analysis`` attr) and its claim's heading
(``title``): nothing here lists the experiments (:func:`analysis_for` finds the module,
:func:`verdicts` and :func:`fit_tables` read a file through it). The fit tables are data
(:mod:`.tables`), shown as HTML tables (a wide one scrolls within its box) and Markdown
tables. The HTML embeds every figure as a base64 PNG drawn afresh from the results file it
documents (no network, no side files); the Markdown gives the same tables for a terminal or a
pull request. Both are written atomically.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import importlib
import io
import json
import os
import sys
from pathlib import Path

import xarray as xr

from ..engine.storage import ResultsError, open_results
from .tables import to_html, to_markdown as tables_markdown, to_text
from .verdicts import calibration_note, count_verdicts, to_markdown

__all__ = ["analysis_for", "build_report", "fit_table", "fit_tables", "report_paths", "verdicts", "write_report"]

PROVENANCE = ("profile", "created", "wall_seconds", "scheduler", "git_revision", "sfxlin_version", "history")


def analysis_for(ds: xr.Dataset):
    """The analysis module a results Dataset names in its ``analysis`` attr."""
    name = ds.attrs.get("analysis")
    if not name:
        raise ValueError(f"the file names no analysis module (attr 'analysis'; experiment "
                         f"{ds.attrs.get('experiment')!r})")
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ValueError(f"its analysis module {name!r} cannot be imported ({exc})") from None


def verdicts(ds: xr.Dataset, module=None) -> list:
    """The verdict rows of a results Dataset by its analysis module (``module``, default
    :func:`analysis_for`): the module's ``verdicts`` (in sfxlin's modules ``CRITERIA.verdicts``;
    a module written outside may add flags of its own there), else ``CRITERIA.verdicts``."""
    module = analysis_for(ds) if module is None else module
    return getattr(module, "verdicts", module.CRITERIA.verdicts)(ds)


def fit_tables(ds: xr.Dataset, module=None):
    """The fit tables of a results Dataset, ``{name: table}`` (:mod:`.tables`), from its analysis
    module (``module``, default :func:`analysis_for`); a module without ``fit_tables`` (one written
    before the tables were data) gives the text of its own ``fit_table(ds)``."""
    module = analysis_for(ds) if module is None else module
    return module.fit_tables(ds) if hasattr(module, "fit_tables") else module.fit_table(ds)


def fit_table(ds: xr.Dataset) -> str:
    """The fit tables of a results Dataset as terminal text (:func:`.tables.to_text` of :func:`fit_tables`)."""
    return to_text(fit_tables(ds))


def _figure_png(module, ds) -> bytes:
    buf = io.BytesIO()
    module.figure(ds, buf)
    return buf.getvalue()


def _section(path: Path):
    ds = open_results(path)  # loaded and closed, schema version checked
    module = analysis_for(ds)
    rows = verdicts(ds, module)
    return {"experiment": ds.attrs["experiment"], "title": ds.attrs.get("title", ds.attrs["experiment"]),
            "note": calibration_note(ds), "path": path, "rows": rows, "counts": count_verdicts(rows),
            "fits": fit_tables(ds, module), "png": _figure_png(module, ds),
            "provenance": {k: ds.attrs.get(k) for k in PROVENANCE}, "config": ds.attrs.get("config", "{}")}


def _print_skip(path, reason):
    print(f"sfxlin: skipped {path}: {reason}", file=sys.stderr, flush=True)


def _sections(folder: Path, on_skip):
    """The report sections of every usable ``*.nc`` file in ``folder`` in claim order (the
    experiment's own file name first), and the ``(path, reason)`` of every file skipped."""
    sections, skipped = [], []
    for path in sorted(p for p in folder.glob("*.nc") if not p.name.startswith(".")):
        try:
            sections.append(_section(path))
        except (ResultsError, ValueError, KeyError) as exc:  # unreadable, other schema, not an sfxlin file
            reason = str(exc)
            reason = f"it {reason[len(str(path)) + 1:]}" if reason.startswith(f"{path} ") else reason
            skipped.append((path, reason))
            on_skip(path, reason)
    sections.sort(key=lambda sec: (sec["experiment"], sec["path"].name != f"{sec['experiment']}.nc",
                                   sec["path"].name))
    return sections, skipped


def _html_table(rows):
    head = "<tr><th>criterion</th><th>description</th><th>measured</th><th>threshold</th><th>reference</th><th>verdict</th></tr>"
    body = []
    for r in rows:
        cls = r.verdict.lower()
        note = f"<br><small>{html.escape(r.note)}</small>" if r.note else ""
        body.append(f"<tr><td>{html.escape(r.id)}</td><td>{html.escape(r.criterion.description)}</td>"
                    f"<td>{html.escape(r.measured_str)}</td><td>{html.escape(r.threshold_str)}</td>"
                    f"<td>{html.escape(r.reference)}</td><td class='{cls}'>{r.verdict}{note}</td></tr>")
    return f"<div class='fit-scroll'><table>{head}{''.join(body)}</table></div>"


STYLE = """body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222;
overflow-wrap:break-word}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
.pass{background:#d9f2d9}.fail{background:#f7d4d4}.inconclusive{background:#f5ecc8}
.fit-scroll{max-width:100%;overflow-x:auto}table.fit{margin:0.3em 0;font-size:0.85em}
table.fit td,table.fit th{padding:2px 6px;white-space:nowrap;overflow-wrap:normal}
table.fit td.num{text-align:right;font-variant-numeric:tabular-nums}
.fit-title{margin:1em 0 0.2em;font-weight:bold}.fit-notes{margin:0.2em 0 1em;font-size:0.85em;color:#555}
pre{background:#f6f6f6;padding:0.8em;overflow-x:auto;font-size:0.85em}img{max-width:100%}"""


def build_report(results_dir, on_skip=None) -> tuple[str, str]:
    """``(html, markdown)`` of every usable results file found in ``results_dir``.

    ``on_skip(path, reason)`` is called for each file skipped (default: a line on stderr,
    ``sfxlin: skipped PATH: REASON``); raises ValueError if no file is usable.
    """
    folder = Path(results_dir)
    sections, skipped = _sections(folder, on_skip or _print_skip)
    if not sections and skipped:
        raise ValueError(f"no usable results files in {folder} ({len(skipped)} skipped, see above)")
    if not sections:
        raise ValueError(f"no results files (*.nc) in {folder}")
    stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>sfxlin report</title><style>{STYLE}</style>"
             "</head><body><h1>sfxlin: softmax attention as linear attention in the large-prompt regime</h1>",
             f"<p>Report of {len(sections)} results files in <code>{html.escape(str(folder))}</code>, written {stamp}. "
             "Verdicts follow the predeclared criteria stored in each file; the reference column quotes an "
             "independent plain-numpy reproduction of the paper (docs/claims.md of the sfxlin repository explains "
             "each claim, docs/criteria.md each criterion).</p>"]
    md = ["# sfxlin report", "", f"{len(sections)} results files in `{folder}`, written {stamp}.", ""]
    for sec in sections:
        title = sec["title"]
        counts = ", ".join(f"{v} {k}" for k, v in sec["counts"].items() if v)
        prov = "".join(f"<li><b>{k}</b>: {html.escape(str(v))}</li>" for k, v in sec["provenance"].items())
        png = base64.b64encode(sec["png"]).decode()
        parts += [f"<h2 id='{html.escape(sec['path'].stem)}'>{html.escape(title)}</h2>",
                  f"<p><code>{html.escape(sec['path'].name)}</code>: {counts}</p>",
                  _html_table(sec["rows"]), f"<p><i>{html.escape(sec['note'])}</i></p>" if sec["note"] else "",
                  "<h3>Fits</h3>", to_html(sec["fits"]),
                  f"<img alt='{sec['experiment']} figure' src='data:image/png;base64,{png}'>",
                  "<h3>Provenance</h3>", f"<ul>{prov}</ul>",
                  f"<details><summary>configuration</summary><pre>{html.escape(json.dumps(json.loads(sec['config']), indent=1))}</pre></details>"]
        md += [f"## {title}", "", f"`{sec['path'].name}`: {counts}", "", to_markdown(sec["rows"]), "",
               *([f"_{sec['note']}_", ""] if sec["note"] else []), "### Fits", "",
               tables_markdown(sec["fits"]), "", "Provenance: " + "; ".join(f"{k} {v}" for k, v in sec["provenance"].items()), ""]
    if skipped:
        parts += ["<h2 id='skipped'>Skipped files</h2>", "<ul>" + "".join(
            f"<li><code>{html.escape(p.name)}</code>: {html.escape(why)}</li>" for p, why in skipped) + "</ul>"]
        md += ["## Skipped files", ""] + [f"- `{p.name}`: {why}" for p, why in skipped] + [""]
    parts.append("</body></html>")
    return "\n".join(parts), "\n".join(md)


def report_paths(out) -> tuple[Path, Path]:
    """``(html, markdown)`` paths for ``--out``: its suffix says which file it is (``.html`` or
    ``.md``), the other is written beside it under the same stem. Any other suffix is refused."""
    out = Path(out)
    suffix = out.suffix.lower()
    if suffix == ".html":
        return out, out.with_suffix(".md")
    if suffix == ".md":
        return out.with_suffix(".html"), out
    raise ValueError(f"report --out must end in .html or .md (the other is written beside it), got {out}")


def _write_atomically(files):
    """Write every ``(path, text)`` to a temporary file beside it, flushed to disk, then rename
    them all into place: a failure leaves every previous file whole and no temporary file."""
    done = []
    try:
        for path, text in files:
            tmp = path.with_name(f".{path.name}.{os.getpid()}.partial")
            done.append(tmp)
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write(text)
                fh.flush()
                os.fsync(fh.fileno())
        for (path, _), tmp in zip(files, done):
            os.replace(tmp, path)
    except BaseException as exc:
        for tmp in done:
            tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise ResultsError(f"could not write {path}: {exc.strerror or exc}") from exc
        raise


def write_report(results_dir, out=None, on_skip=None) -> tuple[Path, Path]:
    """Write the HTML and the Markdown report (:func:`report_paths` of ``out``; by default
    ``report.html`` and ``report.md`` beside the results they read, in ``results_dir``, never in
    another folder), atomically; returns their paths. ``on_skip`` as in :func:`build_report`."""
    html_path, md_path = report_paths(Path(results_dir) / "report.html" if out is None else out)
    page, md = build_report(results_dir, on_skip)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically([(html_path, page), (md_path, md)])
    return html_path, md_path
