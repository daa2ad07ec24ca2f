"""One self-contained report of every claim: verdicts, fits, figures and provenance.

Reads results files only. The HTML embeds every figure as a base64 PNG drawn afresh from the
results file it documents (no network, no side files); the Markdown gives the same tables for
a terminal or a pull request.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import importlib
import io
import json
from pathlib import Path

import xarray as xr

from .verdicts import count_verdicts, to_markdown

__all__ = ["ANALYSES", "analysis_for", "build_report", "write_report"]

#: experiment attr of a results file -> its analysis module (in claim order)
ANALYSES = {"c1_limit": "c1", "c2_concentration": "c2", "c2_threshold": "c2_threshold", "c3_transfer": "c3"}
CLAIMS = {"c1_limit": "C1: softmax attention -> linear operator on the token measure",
          "c2_concentration": "C2: non-asymptotic concentration of outputs and gradients",
          "c2_threshold": "C2: uniform-in-time stability and the tr(Sigma^-2) > 4 threshold",
          "c3_transfer": "C3: large-prompt softmax training inherits linear-attention training"}
PROVENANCE = ("profile", "created", "wall_seconds", "scheduler", "git_revision", "sfxlin_version", "history")


def analysis_for(ds: xr.Dataset):
    """The analysis module of a results Dataset, chosen by its ``experiment`` attr."""
    name = ds.attrs.get("experiment")
    if name not in ANALYSES:
        raise ValueError(f"no analysis for experiment {name!r}; known: {sorted(ANALYSES)}")
    return importlib.import_module(f"{__package__}.{ANALYSES[name]}")


def _figure_png(module, ds) -> bytes:
    buf = io.BytesIO()
    module.figure(ds, buf)
    return buf.getvalue()


def _section(path: Path):
    ds = xr.load_dataset(path)  # loaded and closed: no netCDF handle left to a garbage collector
    module = analysis_for(ds)
    rows = module.verdicts(ds)
    return {"experiment": ds.attrs["experiment"], "path": path, "rows": rows, "counts": count_verdicts(rows),
            "fits": module.fit_table(ds), "png": _figure_png(module, ds),
            "provenance": {k: ds.attrs.get(k) for k in PROVENANCE}, "config": ds.attrs.get("config", "{}")}


def _html_table(rows):
    head = "<tr><th>criterion</th><th>description</th><th>measured</th><th>threshold</th><th>reference</th><th>verdict</th></tr>"
    body = []
    for r in rows:
        cls = r.verdict.lower()
        note = f"<br><small>{html.escape(r.note)}</small>" if r.note else ""
        body.append(f"<tr><td>{html.escape(r.id)}</td><td>{html.escape(r.criterion.description)}</td>"
                    f"<td>{html.escape(r.measured_str)}</td><td>{html.escape(r.threshold_str)}</td>"
                    f"<td>{html.escape(r.reference)}</td><td class='{cls}'>{r.verdict}{note}</td></tr>")
    return f"<table>{head}{''.join(body)}</table>"


STYLE = """body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
.pass{background:#d9f2d9}.fail{background:#f7d4d4}.inconclusive{background:#f5ecc8}
pre{background:#f6f6f6;padding:0.8em;overflow-x:auto;font-size:0.85em}img{max-width:100%}"""


def build_report(results_dir) -> tuple[str, str]:
    """``(html, markdown)`` of every known results file found in ``results_dir``."""
    folder = Path(results_dir)
    sections = [_section(folder / f"{name}.nc") for name in ANALYSES if (folder / f"{name}.nc").exists()]
    if not sections:
        raise ValueError(f"no results files in {folder} (expected some of {[n + '.nc' for n in ANALYSES]})")
    stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>sfxlin report</title><style>{STYLE}</style>"
             "</head><body><h1>sfxlin: softmax attention as linear attention in the large-prompt regime</h1>",
             f"<p>Report of {len(sections)} results files in <code>{html.escape(str(folder))}</code>, written {stamp}. "
             "Verdicts follow the predeclared criteria stored in each file; the reference column quotes the "
             "independent reproduction (SPEC.md).</p>"]
    md = ["# sfxlin report", "", f"{len(sections)} results files in `{folder}`, written {stamp}.", ""]
    for sec in sections:
        title = CLAIMS.get(sec["experiment"], sec["experiment"])
        counts = ", ".join(f"{v} {k}" for k, v in sec["counts"].items() if v)
        prov = "".join(f"<li><b>{k}</b>: {html.escape(str(v))}</li>" for k, v in sec["provenance"].items())
        png = base64.b64encode(sec["png"]).decode()
        parts += [f"<h2 id='{sec['experiment']}'>{html.escape(title)}</h2>",
                  f"<p><code>{html.escape(sec['path'].name)}</code>: {counts}</p>",
                  _html_table(sec["rows"]), "<h3>Fits</h3>", f"<pre>{html.escape(sec['fits'])}</pre>",
                  f"<img alt='{sec['experiment']} figure' src='data:image/png;base64,{png}'>",
                  "<h3>Provenance</h3>", f"<ul>{prov}</ul>",
                  f"<details><summary>configuration</summary><pre>{html.escape(json.dumps(json.loads(sec['config']), indent=1))}</pre></details>"]
        md += [f"## {title}", "", f"`{sec['path'].name}`: {counts}", "", to_markdown(sec["rows"]), "", "```",
               sec["fits"], "```", "", "Provenance: " + "; ".join(f"{k} {v}" for k, v in sec["provenance"].items()), ""]
    parts.append("</body></html>")
    return "\n".join(parts), "\n".join(md)


def write_report(results_dir, out) -> tuple[Path, Path]:
    """Write ``out`` (HTML) and the Markdown beside it (same stem, ``.md``)."""
    page, md = build_report(results_dir)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(page)
    md_path = out.with_suffix(".md")
    md_path.write_text(md)
    return out, md_path
