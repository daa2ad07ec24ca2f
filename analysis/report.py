"""One self-contained report of every claim: what holds first, then verdicts, fits, figures and provenance.

Reads results files only: every ``*.nc`` file of the results folder, whatever its name (a run
saved with ``sfxlin run --name``), matched to its analysis by its ``experiment`` attr. A file
that cannot be read or analysed (damaged, of another schema, another tool's) is skipped with a
line saying which and why, and listed in the report; the report fails only when no file is
usable. A file names its own analysis module (``analysis`` attr) and its claim's heading
(``title``): nothing here lists the experiments (:func:`analysis_for` finds the module,
:func:`verdicts` and :func:`fit_tables` read a file through it).

The page opens with the answer per claim: one sentence per claim as the report groups the files
(:func:`claim_groups`: a claim's own experiments, each claim id of its own, a claim's extensions;
:func:`claim_sentence`), the FAILs counted by class (:func:`class_line`: finding, pre-asymptotic,
colloquial reading, and ``unclassified`` where a criterion declares none), one summary table (per
file: its claim, experiment, profile, and how many verdicts PASS, FAIL, are INCONCLUSIVE, NOT JUDGED,
and how many are fragile), one line of :func:`.verdicts.multiplicity_line` over every verdict of
every file (every FAIL counted, then the statistical tests alone), and a table of every FAIL and
INCONCLUSIVE with its class, reason and note; a file that is not a paper run carries a banner
(:func:`.verdicts.calibration_note`). Then one section per file in
the claims' order (:func:`reading_order`), each verdict with its robustness and, when it is not
a PASS, the class and reason its criterion declares. Each file's verdicts are computed once
(their robustness judges 100 resamples of the file's independent units, every measure called once on them all).

The fit tables are data (:mod:`.tables`), shown as HTML tables (a wide one scrolls within its
box) and Markdown tables. The HTML embeds every figure as a base64 PNG drawn afresh from the
results file it documents (no network, no side files); the Markdown gives the same tables for a
terminal or a pull request. Both are written atomically.
"""
from __future__ import annotations

import base64
import datetime as _dt
import html
import io
import json
import math
import os
import re
import sys
from pathlib import Path

import xarray as xr

from ..engine.protocol import Analysis, ProtocolError, load_analysis
from ..engine.storage import ResultsError, open_results
from .tables import to_html, to_markdown as tables_markdown, to_text
from .verdicts import (CLASSES, FAIL, INCONCLUSIVE, NOT_JUDGED, PASS, UNCLASSIFIED, calibration_note, count_classes,
                       count_verdicts, multiplicity_line)

__all__ = ["analysis_for", "build_report", "claim_answer", "claim_groups", "claim_sentence", "class_line", "fit_table",
           "fit_tables", "reading_order", "report_paths", "verdicts", "write_report"]

PROVENANCE = ("profile", "created", "wall_seconds", "scheduler", "git_revision", "sfxlin_version", "history")

#: the columns of the summary table's counts (:func:`.verdicts.count_verdicts`)
COUNTS = (PASS, FAIL, INCONCLUSIVE, NOT_JUDGED, "fragile")


def analysis_for(ds: xr.Dataset) -> Analysis:
    """The analysis module a results Dataset names in its ``analysis`` attr, checked against the
    plug-in protocol (:class:`~sfxlin.engine.protocol.Analysis`)."""
    name = ds.attrs.get("analysis")
    if not name:
        raise ValueError(f"the file names no analysis module (attr 'analysis'; experiment "
                         f"{ds.attrs.get('experiment')!r})")
    return load_analysis(name)


def _analysis(ds, module) -> Analysis:
    """``module`` (a module, or an :class:`Analysis`) as an :class:`Analysis`; default: :func:`analysis_for`."""
    if module is None:
        return analysis_for(ds)
    return module if isinstance(module, Analysis) else Analysis(module)


def verdicts(ds: xr.Dataset, module=None, *, resamples: int | None = None) -> list:
    """The verdict rows of a results Dataset by its analysis module (``module``, default
    :func:`analysis_for`): the module's own ``verdicts``, else its ``CRITERIA.verdicts``.
    ``resamples`` (default: the module's, :data:`.verdicts.RESAMPLES`) sets how many resamples of
    the independent units each verdict's robustness takes (0: none)."""
    return _analysis(ds, module).verdicts(ds, resamples=resamples)


def fit_tables(ds: xr.Dataset, module=None):
    """The fit tables of a results Dataset, ``{name: table}`` (:mod:`.tables`), from its analysis
    module (``module``, default :func:`analysis_for`); a module without ``fit_tables`` (one written
    before the tables were data) gives the text of its own ``fit_table(ds)``."""
    return _analysis(ds, module).fit_tables(ds)


def fit_table(ds: xr.Dataset) -> str:
    """The fit tables of a results Dataset as terminal text (:func:`.tables.to_text` of :func:`fit_tables`)."""
    return to_text(fit_tables(ds))


def reading_order(experiment: str, title: str, claim: str, file_name: str = "") -> tuple:
    """The sort key of a results file in the report, from its own data: its ``experiment`` attr,
    its ``title`` and the claim of its first criterion.

    Claims in their number's order (``C1``, ``C2``, ``C3``; a claim id not of the form ``C<n>...``
    after every numbered one); within a claim, first the claim's own experiments (a title that
    opens with the claim's id and a colon: ``"C2: ..."``), then the experiments judged under a
    claim id of their own (``C3L``: the landscape claim), then the extensions judged under the
    claim's own id (``"C1 kernels: ..."``, ``"C3 deep: ..."``); by experiment name within each,
    an experiment's own file (``EXP.nc``) before the other files of it. The shipped files come
    in the order c1_limit, c1_kernels, c1_real, c2_concentration, c2_threshold, c3_transfer,
    c3_landscape, c3_deep.
    """
    found = re.match(r"C(\d+)", claim or "")
    family = int(found.group(1)) if found else math.inf
    own = (title or "").split(":", 1)[0].strip() == claim and ":" in (title or "")
    rank = 0 if own else 1 if found and claim != f"C{family}" else 2
    return (family, rank, experiment, file_name != f"{experiment}.nc", file_name)


def _figure_png(module, ds) -> bytes:
    buf = io.BytesIO()
    module.figure(ds, buf)
    return buf.getvalue()


def _claims(ds) -> list:
    """The claims of a file's stored criteria, in their order, each once."""
    from .verdicts import criteria_from_attrs

    return list(dict.fromkeys(c.claim for c in criteria_from_attrs(ds)))


def _section(path: Path, resamples=None):
    ds = open_results(path)  # loaded and closed, schema version checked
    module = analysis_for(ds)
    claims = _claims(ds)
    rows = verdicts(ds, module, resamples=resamples)  # once per file: its robustness calls every measure
    experiment = ds.attrs["experiment"]
    title = ds.attrs.get("title", experiment)
    profile = ds.attrs.get("profile", "custom") + (" + --set" if json.loads(ds.attrs.get("overrides") or "[]") else "")
    return {"experiment": experiment, "title": title, "claims": claims, "profile": profile,
            "note": calibration_note(ds), "path": path, "rows": rows, "counts": count_verdicts(rows),
            "order": reading_order(experiment, title, claims[0] if claims else "", path.name),
            "fits": fit_tables(ds, module), "png": _figure_png(module, ds),
            "provenance": {k: ds.attrs.get(k) for k in PROVENANCE}, "config": ds.attrs.get("config", "{}")}


def _print_skip(path, reason):
    print(f"sfxlin: skipped {path}: {reason}", file=sys.stderr, flush=True)


def _sections(folder: Path, on_skip, resamples=None, on_verdicts=None):
    """The report sections of every usable ``*.nc`` file in ``folder`` in the claims' order
    (:func:`reading_order`), and the ``(path, reason)`` of every file skipped."""
    sections, skipped = [], []
    for path in sorted(p for p in folder.glob("*.nc") if not p.name.startswith(".")):
        try:
            sec = _section(path, resamples)
        except (ResultsError, ValueError, KeyError, ProtocolError) as exc:  # unreadable, other schema, not an
            # sfxlin file, an analysis module that cannot serve
            reason = str(exc)
            reason = f"it {reason[len(str(path)) + 1:]}" if reason.startswith(f"{path} ") else reason
            skipped.append((path, reason))
            on_skip(path, reason)
            continue
        sections.append(sec)
        if on_verdicts is not None:
            on_verdicts(path, sec["rows"])
    sections.sort(key=lambda sec: sec["order"])
    return sections, skipped


# ------------------------------------------------------------------------------------ verdict rows

_ROW_HEAD = ("criterion", "description", "measured", "threshold", "reference", "verdict", "robustness", "class",
             "note")


def _row_cells(r) -> dict:
    """The cells of one verdict row as plain text (the HTML and the Markdown tables show these)."""
    robust = r.robustness_str or (f"n/a ({r.robustness_note})" if r.robustness_note else "")
    return {"criterion": r.id, "description": r.criterion.description, "measured": r.measured_str,
            "threshold": r.threshold_str, "reference": r.reference, "verdict": r.verdict, "robustness": robust,
            "class": r.class_str, "note": r.note}


def _columns(rows, columns) -> list:
    """``columns`` less ``class`` and ``note`` when no row has one (a table of PASSes has neither)."""
    shown = {"class": any(r.class_name for r in rows), "note": any(r.note for r in rows)}
    return [h for h in columns if shown.get(h, True)]


def _html_rows(rows) -> str:
    esc = html.escape
    columns = _columns(rows, _ROW_HEAD)
    head = "".join(f"<th>{h}</th>" for h in columns)
    body = []
    for r in rows:
        c = {k: f"<td>{esc(v)}</td>" for k, v in _row_cells(r).items()}
        c["criterion"] = f"<td class='id'>{esc(r.id)}</td>"
        c["verdict"] = f"<td class='{r.verdict.lower().replace(' ', '-')}'>{r.verdict}</td>"
        if r.fragile:
            c["robustness"] = f"<td class='fragile'>{esc(r.robustness_str)}</td>"
        c["class"] = _class_cell(r)
        body.append("<tr>" + "".join(c[h] for h in columns) + "</tr>")
    return f"<div class='fit-scroll'><table class='verdicts'><tr>{head}</tr>{''.join(body)}</table></div>"


def _class_cell(r) -> str:
    """The HTML cell of a row's class: the declared class in bold and its reason; ``unclassified`` marked
    loudly (a FAIL or INCONCLUSIVE whose criterion declares no class)."""
    if r.fails_as:
        return f"<td><b>{html.escape(r.fails_as[0])}</b>: {html.escape(r.fails_as[1])}</td>"
    if r.class_name == UNCLASSIFIED:
        return f"<td class='unclassified'>{UNCLASSIFIED}</td>"
    return "<td></td>"


def _md_cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_rows(rows) -> str:
    head = _columns(rows, [h for h in _ROW_HEAD if h != "description"])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for r in rows:
        cells = _row_cells(r)
        cells["verdict"] = f"**{r.verdict}**" if r.verdict != PASS else r.verdict
        if r.class_name == UNCLASSIFIED:
            cells["class"] = f"**{UNCLASSIFIED}**"
        lines.append("| " + " | ".join(_md_cell(cells[h]) for h in head) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ summary

def _summary_cells(sec) -> list:
    """claim, experiment (with the file name when it is not ``EXP.nc``), profile, the counts."""
    name = sec["path"].name
    what = sec["experiment"] + ("" if name == f"{sec['experiment']}.nc" else f" ({name})")
    return [", ".join(sec["claims"]), what, sec["profile"], *(str(sec["counts"][k]) for k in COUNTS)]


def _summary_head() -> list:
    return ["claim", "experiment", "profile", *COUNTS]


def _totals(sections) -> dict:
    return {k: sum(sec["counts"][k] for sec in sections) for k in COUNTS}


def _summary_html(sections) -> str:
    esc = html.escape
    head = "".join(f"<th>{esc(h)}</th>" for h in _summary_head())
    body = []
    for sec in sections:
        cells = _summary_cells(sec)
        anchor = esc(sec["path"].stem)
        row = [f"<td>{esc(cells[0])}</td>", f"<td><a href='#{anchor}'>{esc(cells[1])}</a></td>",
               f"<td class='{'not-paper' if sec['note'] else ''}'>{esc(cells[2])}</td>"]
        for k, v in zip(COUNTS, cells[3:]):
            mark = "zero" if v == "0" else k.lower().replace(" ", "-")
            row.append(f"<td class='num {mark}'>{v}</td>")
        body.append("<tr>" + "".join(row) + "</tr>")
    totals = _totals(sections)
    body.append("<tr class='total'><td colspan='3'>all files</td>"
                + "".join(f"<td class='num'>{totals[k]}</td>" for k in COUNTS) + "</tr>")
    return f"<div class='fit-scroll'><table class='summary'><tr>{head}</tr>{''.join(body)}</table></div>"


def _summary_md(sections) -> str:
    head = _summary_head()
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    for sec in sections:
        lines.append("| " + " | ".join(_md_cell(c) for c in _summary_cells(sec)) + " |")
    totals = _totals(sections)
    lines.append("| all files | | | " + " | ".join(str(totals[k]) for k in COUNTS) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ per claim

def claim_groups(sections) -> list:
    """``[(label, sections)]``: the files grouped as the report orders them (:func:`reading_order`), one
    group per claim: a claim's own experiments (label ``"C2"``), each claim id of its own (``"C3L"``),
    and the extensions judged under a claim's id (``"C1, extensions"``), in reading order."""
    groups = {}
    for sec in sections:
        family, rank = sec["order"][:2]
        claim = sec["claims"][0] if sec["claims"] else sec["experiment"]
        label = f"{claim}, extensions" if rank == 2 and math.isfinite(family) else claim
        groups.setdefault((family, rank, label), []).append(sec)
    return [(key[2], secs) for key, secs in sorted(groups.items(), key=lambda item: item[0])]


def _by_class(rows, verdict) -> str:
    """``"finding: C2-a, C2-b; pre-asymptotic: C2-c"``: the ids of ``rows`` of ``verdict`` by class."""
    order = (*CLASSES, UNCLASSIFIED)
    ids = {c: [r.id for r in rows if r.verdict == verdict and r.class_name == c] for c in order}
    return "; ".join(f"{c}: {', '.join(ids[c])}" for c in order if ids[c])


def claim_answer(rows) -> str:
    """The answer of a claim's verdicts, in a few words: ``holds`` (every judged verdict PASS), ``holds
    where judged`` (INCONCLUSIVE or NOT JUDGED besides), ``holds but for FAILs that are pre-asymptotic or
    colloquial readings``, ``holds in part`` (a FAIL is a finding against it), ``open`` (a FAIL whose
    criterion declares no class: it says nothing yet), ``not judged``."""
    counts, fails = count_verdicts(rows), count_classes(rows)
    if fails[UNCLASSIFIED]:
        return f"open: {fails[UNCLASSIFIED]} FAIL unclassified"
    if fails["finding"]:
        return f"holds in part: {fails['finding']} {'FAIL is a finding' if fails['finding'] == 1 else 'FAILs are findings'}"
    if counts[FAIL]:
        return "holds but for FAILs that are pre-asymptotic or colloquial readings"
    if counts[INCONCLUSIVE] or counts[NOT_JUDGED]:
        return "holds where judged" if counts[PASS] else "not judged"
    return "holds" if counts[PASS] else "not judged"


def claim_sentence(label, sections) -> str:
    """One sentence per claim: its label and experiments, :func:`claim_answer`, then the counts, the
    FAILs and INCONCLUSIVEs named by class (:func:`_by_class`)."""
    rows = [r for sec in sections for r in sec["rows"]]
    counts = count_verdicts(rows)
    parts = [f"{counts[PASS]} PASS"]
    for verdict in (FAIL, INCONCLUSIVE):
        if counts[verdict]:
            parts.append(f"{counts[verdict]} {verdict} ({_by_class(rows, verdict)})")
    if counts[NOT_JUDGED]:
        parts.append(f"{counts[NOT_JUDGED]} {NOT_JUDGED}")
    names = ", ".join(sec["experiment"] for sec in sections)
    return f"{label} ({names}): {claim_answer(rows)} — {', '.join(parts)}."


def class_line(rows) -> str:
    """``"19 FAIL by class: 7 finding, 4 pre-asymptotic, 4 colloquial reading, 4 unclassified"``."""
    fails = count_classes(rows)
    return f"{sum(fails.values())} FAIL by class: " + ", ".join(f"{n} {c}" for c, n in fails.items())


_OPEN_HEAD = ("claim", "criterion", "verdict", "class", "why", "note")


def _open_rows(sections) -> list:
    """Every FAIL and INCONCLUSIVE of every file, in reading order: ``(claim, row)``."""
    return [(label, r) for label, secs in claim_groups(sections) for sec in secs for r in sec["rows"]
            if r.verdict in (FAIL, INCONCLUSIVE)]


def _open_html(sections) -> str:
    esc = html.escape
    body = []
    for label, r in _open_rows(sections):
        why = esc(r.fails_as[1]) if r.fails_as else ""
        body.append(f"<tr><td>{esc(label)}</td><td class='id'>{esc(r.id)}</td>"
                    f"<td class='{r.verdict.lower()}'>{r.verdict}</td>"
                    + (f"<td><b>{esc(r.class_name)}</b></td>" if r.fails_as else _class_cell(r))
                    + f"<td>{why}</td><td>{esc(r.note)}</td></tr>")
    head = "".join(f"<th>{h}</th>" for h in _OPEN_HEAD)
    return f"<div class='fit-scroll'><table class='verdicts'><tr>{head}</tr>{''.join(body)}</table></div>"


def _open_md(sections) -> str:
    lines = ["| " + " | ".join(_OPEN_HEAD) + " |", "|" + "|".join("---" for _ in _OPEN_HEAD) + "|"]
    for label, r in _open_rows(sections):
        cls = r.class_name if r.fails_as else f"**{r.class_name}**"
        cells = (label, r.id, f"**{r.verdict}**", cls, r.fails_as[1] if r.fails_as else "", r.note)
        lines.append("| " + " | ".join(_md_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _not_paper_line(sections) -> str:
    """``"2 of 8 files are not paper runs: ..."``, or ``""`` when every file is judged as calibrated."""
    marked = [sec for sec in sections if sec["note"]]
    if not marked:
        return ""
    if len(sections) == 1:
        which = "The file is a quick or custom run"
    elif len(marked) == len(sections):
        which = f"All {len(sections)} files are quick or custom runs"
    else:
        which = (f"{len(marked)} of {len(sections)} files ({', '.join(sec['path'].name for sec in marked)}) are "
                 "quick or custom runs")
    return (f"{which}, not the paper profile the criteria judge the claims at: their verdicts are a smoke test "
            "of the install or indicative, not findings (the banner of each section says how it is judged).")


STYLE = """body{font-family:sans-serif;max-width:1200px;margin:2em auto;padding:0 1em;color:#222;
overflow-wrap:break-word}
table{border-collapse:collapse;margin:1em 0;font-size:0.9em}td,th{border:1px solid #ccc;padding:4px 8px;text-align:left}
.pass{background:#d9f2d9}.fail{background:#f7d4d4}.inconclusive{background:#f5ecc8}.not-judged{background:#e4e4ee}
td.fragile{background:#fbe3c4;font-weight:bold}td.unclassified{background:#f7b0b0;font-weight:bold}table.verdicts td.id{white-space:nowrap}
table.summary td.zero{color:#aaa}table.summary td.fail{font-weight:bold}table.summary tr.total td{font-weight:bold}
table.summary td.not-paper{background:#fff3b0;font-weight:bold}
.banner{background:#fff3b0;border:2px solid #d4a800;border-radius:4px;padding:0.6em 1em;margin:1em 0;
font-weight:bold}
.multiplicity{margin:0.3em 0 1em}
.fit-scroll{max-width:100%;overflow-x:auto}table.fit{margin:0.3em 0;font-size:0.8em}
table.fit td,table.fit th{padding:2px 4px;overflow-wrap:normal;hyphens:none}/* a cell wraps at a space only: a number never breaks, a wide table fits the page */
table.fit td.num{text-align:right;font-variant-numeric:tabular-nums}
table.summary td.num{text-align:right;font-variant-numeric:tabular-nums}
.fit-title{margin:1em 0 0.2em;font-weight:bold}.fit-notes{margin:0.2em 0 1em;font-size:0.85em;color:#555}
pre{background:#f6f6f6;padding:0.8em;overflow-x:auto;font-size:0.85em}img{max-width:100%}"""


def build_report(results_dir, on_skip=None, *, resamples=None, on_verdicts=None) -> tuple[str, str]:
    """``(html, markdown)`` of every usable results file found in ``results_dir``.

    ``on_skip(path, reason)`` is called for each file skipped (default: a line on stderr,
    ``sfxlin: skipped PATH: REASON``), ``on_verdicts(path, rows)`` (optional) with the verdict
    rows of each file judged; ``resamples`` as in :func:`verdicts`. Raises ValueError if no file
    is usable.
    """
    folder = Path(results_dir)
    sections, skipped = _sections(folder, on_skip or _print_skip, resamples, on_verdicts)
    if not sections and skipped:
        raise ValueError(f"no usable results files in {folder} ({len(skipped)} skipped, see above)")
    if not sections:
        raise ValueError(f"no results files (*.nc) in {folder}")
    stamp = _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()
    every_row = [r for sec in sections for r in sec["rows"]]
    multiplicity = multiplicity_line(every_row)
    not_paper = _not_paper_line(sections)
    answers = [claim_sentence(label, secs) for label, secs in claim_groups(sections)]
    classes, open_rows = class_line(every_row), _open_rows(sections)
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>sfxlin report</title><style>{STYLE}</style>"
             "</head><body><h1>sfxlin: softmax attention as linear attention in the large-prompt regime</h1>",
             f"<p>Report of {len(sections)} results files in <code>{html.escape(str(folder))}</code>, written {stamp}. "
             "Verdicts follow the predeclared criteria stored in each file; the reference column quotes an "
             "independent plain-numpy reproduction of the paper (docs/claims.md of the sfxlin repository explains "
             "each claim, docs/criteria.md each criterion).</p>",
             "<h2 id='summary'>What holds</h2>",
             *([f"<div class='banner'>{html.escape(not_paper)}</div>"] if not_paper else []),
             "<ul class='claims'>" + "".join(f"<li>{html.escape(sentence)}</li>" for sentence in answers) + "</ul>",
             f"<p class='classes'>{html.escape(classes)}.</p>",
             _summary_html(sections),
             f"<p class='multiplicity'>Over every file: {html.escape(multiplicity)}. A fragile verdict is one kept "
             "in fewer than 80% of the resamples of its file's independent units (seeds); a non-PASS verdict shows "
             "the class its criterion declares for it (a finding, pre-asymptotic, or a colloquial reading of the "
             f"paper) and why, or <b>{UNCLASSIFIED}</b> where it declares none.</p>",
             *(["<h3 id='open'>Every FAIL and INCONCLUSIVE</h3>", _open_html(sections)] if open_rows else [])]
    md = ["# sfxlin report", "", f"{len(sections)} results files in `{folder}`, written {stamp}.", "",
          "## What holds", "", *([f"> **{not_paper}**", ""] if not_paper else []),
          *(f"- {sentence}" for sentence in answers), "", f"{classes}.", "", _summary_md(sections), "",
          f"Over every file: {multiplicity}.", "",
          *(["### Every FAIL and INCONCLUSIVE", "", _open_md(sections), ""] if open_rows else [])]
    for sec in sections:
        title = sec["title"]
        counts = ", ".join(f"{v} {k}" for k, v in sec["counts"].items() if v)
        prov = "".join(f"<li><b>{k}</b>: {html.escape(str(v))}</li>" for k, v in sec["provenance"].items())
        png = base64.b64encode(sec["png"]).decode()
        parts += [f"<h2 id='{html.escape(sec['path'].stem)}'>{html.escape(title)}</h2>",
                  f"<div class='banner'>{html.escape(sec['note'])}</div>" if sec["note"] else "",
                  f"<p><code>{html.escape(sec['path'].name)}</code>: {counts}</p>",
                  _html_rows(sec["rows"]),
                  "<h3>Fits</h3>", to_html(sec["fits"]),
                  f"<img alt='{html.escape(sec['experiment'])} figure' src='data:image/png;base64,{png}'>",
                  "<h3>Provenance</h3>", f"<ul>{prov}</ul>",
                  f"<details><summary>configuration</summary><pre>{html.escape(json.dumps(json.loads(sec['config']), indent=1))}</pre></details>"]
        md += [f"## {title}", "", *([f"> **{sec['note']}**", ""] if sec["note"] else []),
               f"`{sec['path'].name}`: {counts}", "", _md_rows(sec["rows"]), "", "### Fits", "",
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


def write_report(results_dir, out=None, on_skip=None, *, resamples=None, on_verdicts=None) -> tuple[Path, Path]:
    """Write the HTML and the Markdown report (:func:`report_paths` of ``out``; by default
    ``report.html`` and ``report.md`` beside the results they read, in ``results_dir``, never in
    another folder), atomically; returns their paths. ``on_skip``, ``resamples`` and
    ``on_verdicts`` as in :func:`build_report`."""
    html_path, md_path = report_paths(Path(results_dir) / "report.html" if out is None else out)
    page, md = build_report(results_dir, on_skip, resamples=resamples, on_verdicts=on_verdicts)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    _write_atomically([(html_path, page), (md_path, md)])
    return html_path, md_path
