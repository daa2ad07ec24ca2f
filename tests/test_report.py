"""The offline report: every claim's verdicts, fits, figures (embedded) and provenance."""
import base64
import json
import os
import re
import shutil
import subprocess
from html import escape as html_escape
from pathlib import Path

import pytest
import xarray as xr

from sfxlin.analysis.report import STYLE, build_report, write_report
from sfxlin.analysis.tables import column, make_table, to_html
from sfxlin.cli import main


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("results")
    assert main(["run", "c1", "--quiet", "--out", str(out)]) == 0
    return out


def test_html_is_self_contained_with_every_verdict_and_figure(results):
    page, md = build_report(results, resamples=0)
    ds = xr.load_dataset(results / "c1_limit.nc")
    for crit in ("C1-quadrature", "C1-slopes", "C1-plateau"):
        assert crit in page and crit in md
    assert "http://" not in page and "https://" not in page  # nothing to fetch
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == 1
    assert base64.b64decode(images[0])[:8] == b"\x89PNG\r\n\x1a\n"
    assert ds.attrs["git_revision"] in page and ds.attrs["created"] in page
    assert "paper form" in page  # the fit table


def test_fits_are_tables_not_text_blocks(results):
    """The fit tables are HTML tables (in a scrolling box) and Markdown pipe tables, not
    preformatted text: no <pre> between a section's Fits heading and its figure."""
    page, md = build_report(results, resamples=0)
    fits = page.split("<h3>Fits</h3>")[1].split("<img")[0]
    assert "<div class='fit-scroll'><table class='fit'>" in fits and "<pre" not in fits
    assert "paper form L*mse" in fits and "<th>slope</th>" in fits
    md_fits = md.split("### Fits")[1].split("Provenance:")[0]
    assert "```" not in md_fits and "| d | U_norm | slope |" in md_fits


def test_report_figures_are_drawn_from_the_current_file(results, tmp_path):
    """Change the data: the embedded figure changes with it (no stale picture)."""
    first = re.findall(r"base64,([^']+)'", build_report(results, resamples=0)[0])[0]
    moved = tmp_path / "r"
    shutil.copytree(results, moved)
    with xr.open_dataset(moved / "c1_limit.nc") as ds:
        changed = ds.load()
    changed["mse"] = changed.mse * 2
    (moved / "c1_limit.nc").unlink()
    changed.to_netcdf(moved / "c1_limit.nc")
    second = re.findall(r"base64,([^']+)'", build_report(moved, resamples=0)[0])[0]
    assert first != second


def test_cli_writes_html_and_markdown(results, tmp_path, capsys):
    assert main(["report", "--results", str(results), "--out", str(tmp_path / "report.html")]) == 0
    assert (tmp_path / "report.html").read_text().startswith("<!doctype html>")
    assert (tmp_path / "report.md").read_text().startswith("# sfxlin report")


def test_empty_folder_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no results files"):
        build_report(tmp_path)


def _require_chromium():
    """Skip where no ``chromium`` is on PATH (a fresh machine), saying why and how to get it; under
    CI (``CI=true``, where ``.ci/run`` installs it first) a missing browser is a failure, not a skip."""
    if shutil.which("chromium") is not None:
        return
    why = ("headless Chromium not installed: no `chromium` on PATH, so the report's figures are not "
           "loaded in a browser (install it with `apt-get install -y chromium`; .ci/run does)")
    if os.environ.get("CI", "").lower() in ("true", "1"):
        pytest.fail(f"CI=true but {why}")
    pytest.skip(why)


def test_every_figure_loads_in_headless_chromium(results, tmp_path):
    _require_chromium()
    html_path, _ = write_report(results, tmp_path / "report.html", resamples=0)
    probe = tmp_path / "probe.html"
    probe.write_text(html_path.read_text().replace(
        "</body>", "<script>window.onload=()=>{const i=[...document.images];"
        "document.title=i.length+':'+i.filter(x=>x.complete&&x.naturalWidth>0).length}</script></body>"))
    dom = subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                          "--no-first-run", f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", probe.as_uri()],
                         capture_output=True, text=True, timeout=120).stdout
    title = re.search(r"<title>(\d+):(\d+)</title>", dom)
    assert title, dom[:500]
    assert title.group(1) == title.group(2) != "0"


def _dump_dom(page, tmp_path, width):
    path = tmp_path / "page.html"
    path.write_text(page)
    return subprocess.run(["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--no-first-run", f"--window-size={width},900", f"--user-data-dir={tmp_path / 'profile'}",
                           "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=120).stdout


def test_a_wide_fit_table_scrolls_within_its_box_on_a_1280_px_page(results, tmp_path):
    """The report's page with a 40-column fit table added: at 1280 px the page itself does not
    scroll sideways (document width <= 1280), the table's box does (wider content than box)."""
    _require_chromium()
    wide = xr.DataArray([[123456.789] * 40], dims=("row", "col"), coords={"row": [0], "col": range(40)})
    table = to_html(make_table({"v": column(wide, "a wide spread variable", ".6f")}, column_dim="col", title="wide"))
    page = build_report(results, resamples=0)[0].replace("</body>", table + (
        "<script>window.onload=()=>{const b=[...document.querySelectorAll('.fit-scroll')].pop();"
        "document.title=document.documentElement.scrollWidth+':'+b.scrollWidth+':'+b.clientWidth}</script></body>"))
    assert STYLE in page
    title = re.search(r"<title>(\d+):(\d+):(\d+)</title>", _dump_dom(page, tmp_path, 1280))
    assert title, "no layout measured"
    page_width, content, box = (int(g) for g in title.groups())
    assert page_width <= 1280 and content > box, (page_width, content, box)


# --------------------------------------------------------------------------------------------
# what holds in five seconds: summary, claims' order, robustness and class, banner, layout
# --------------------------------------------------------------------------------------------
DATASETS = Path(__file__).resolve().parent.parent / "datasets"
#: the documented reading order of the shipped files (report.reading_order)
SHIPPED_ORDER = ["c1_limit", "c1_kernels", "c1_own", "c1_real", "c2_concentration", "c2_threshold", "c3_transfer",
                 "c3_dim", "c3_horizon", "c3_landscape", "c3_real", "c3_shift", "c3_deep"]


def _rows_with_every_status():
    """A PASS (robustness 0.95), a fragile FAIL with its class, a NOT JUDGED with its note."""
    from dataclasses import replace

    from sfxlin.analysis.verdicts import NOT_JUDGED, Criterion, VerdictRow, evaluate

    crit = [Criterion(id=f"C1-{k}", claim="C1", description=f"the {k} figure", kind="<", threshold=1.0)
            for k in ("good", "bad", "later")]
    good, bad, _ = evaluate(crit, {"C1-good": 0.5, "C1-bad": 2.0, "C1-later": 0.5})
    return [replace(good, robustness=0.95),
            replace(bad, robustness=0.5, fails_as=("pre-asymptotic", "the rate is not reached at L = 64")),
            VerdictRow(crit[2], None, "n/a", NOT_JUDGED, "not judged at the quick profile: 4 prompt lengths",
                       fails_as=("finding", "too short a grid"))]


def test_the_report_opens_with_what_holds(results):
    """One summary table before the first section: per file its claim, experiment, profile and the
    five counts of its verdicts, and one multiplicity line over every verdict; in both formats."""
    from sfxlin.analysis import c1
    from sfxlin.analysis.verdicts import count_verdicts, multiplicity_line

    page, md = build_report(results, resamples=3)
    rows = c1.CRITERIA.verdicts(xr.load_dataset(results / "c1_limit.nc"), resamples=3)
    counts = count_verdicts(rows)
    summary = page.split("<h2 id='summary'>What holds</h2>")[1].split("<h2 ")[0]
    assert page.index("id='summary'") < page.index("id='c1_limit'")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", summary.split("<table class='summary'>")[1].split("</tr>")[1])
    assert cells[0] == "C1" and "c1_limit" in cells[1] and cells[2] == "quick"
    assert cells[3:] == [str(counts[k]) for k in ("PASS", "FAIL", "INCONCLUSIVE", "NOT JUDGED", "fragile")]
    line = multiplicity_line(rows)
    assert f"Over every file: {html_escape(line)}." in summary
    md_summary = md.split("## What holds")[1].split("\n## ")[0]
    assert "| claim | experiment | profile | PASS | FAIL | INCONCLUSIVE | NOT JUDGED | fragile |" in md_summary
    shown = " | ".join(str(counts[k]) for k in ("PASS", "FAIL", "INCONCLUSIVE", "NOT JUDGED", "fragile"))
    assert f"| C1 | c1_limit | quick | {shown} |" in md_summary
    assert f"Over every file: {line}." in md_summary


def test_each_verdict_shows_its_robustness_and_for_a_non_pass_its_class_and_note(results, monkeypatch):
    from sfxlin.analysis import c1

    rows = _rows_with_every_status()
    monkeypatch.setattr(c1, "verdicts", lambda ds, resamples=None: rows)
    page, md = build_report(results)
    table = page.split("<h2 id='c1_limit'>")[1].split("<table class='verdicts'>")[1].split("</table>")[0]
    head, good, bad, later = table.split("</tr>")[:4]
    assert re.findall(r"<th>(.*?)</th>", head) == ["criterion", "description", "measured", "threshold", "reference",
                                                   "verdict", "robustness", "class", "note"]
    assert "<td>0.95</td>" in good and "class='pass'" in good and re.findall(r"<td></td>", good)  # no class, note
    assert "<td class='fragile'>0.50 fragile</td>" in bad and "class='fail'" in bad
    assert "<b>pre-asymptotic</b>: the rate is not reached at L = 64" in bad
    assert "class='not-judged'" in later and "<b>finding</b>: too short a grid" in later
    assert "not judged at the quick profile: 4 prompt lengths" in later
    summary = page.split("<table class='summary'>")[1].split("</table>")[0]
    assert [c for c in re.findall(r"<td class='num[^']*'>(\d+)</td>", summary.split("</tr>")[1])] == \
        ["1", "1", "0", "1", "1"]
    md_table = md.split("`c1_limit.nc`")[1].split("### Fits")[0]
    assert "| criterion | measured | threshold | reference | verdict | robustness | class | note |" in md_table
    assert "| C1-bad | 2 | < 1 |  | **FAIL** | 0.50 fragile | pre-asymptotic: the rate is not reached at L = 64 |  |" \
        in md_table
    assert "| C1-good | 0.5 | < 1 |  | PASS | 0.95 |  |  |" in md_table


def test_a_table_of_passes_has_no_empty_class_or_note_column(results, monkeypatch):
    from sfxlin.analysis import c1

    monkeypatch.setattr(c1, "verdicts", lambda ds, resamples=None: _rows_with_every_status()[:1])
    page, md = build_report(results)
    head = page.split("<table class='verdicts'>")[1].split("</tr>")[0]
    assert "<th>robustness</th>" in head and "<th>class</th>" not in head and "<th>note</th>" not in head
    assert "| criterion | measured | threshold | reference | verdict | robustness |\n" in md


def test_a_quick_file_carries_a_visible_banner_and_a_paper_file_none(results, tmp_path):
    from sfxlin.analysis.verdicts import calibration_note

    ds = xr.load_dataset(results / "c1_limit.nc")
    note = calibration_note(ds)
    assert note.startswith("note: quick profile")
    page, md = build_report(results, resamples=0)
    section = page.split("<h2 id='c1_limit'>")[1]
    assert section.index(f"<div class='banner'>{html_escape(note)}</div>") < section.index("<table")
    assert "<i>" not in page and ".banner{" in STYLE
    assert f"> **{note}**" in md
    assert "<div class='banner'>The file is a quick or custom run" in page  # and at the top
    ds.attrs["overrides"] = json.dumps(["n_prompts=16"])   # a custom quick run is judged by the quick thresholds
    assert calibration_note(ds) == ("note: custom run: quick profile with --set n_prompts=16: judged by thresholds "
                                    "calibrated for the quick grid, which these overrides change, so its verdicts are "
                                    "indicative, not findings; the claims are judged at the paper profile")
    ds.attrs["overrides"] = "[]"
    ds.attrs["profile"] = "paper"  # the same file as a paper run: judged as calibrated, no banner
    folder = tmp_path / "paper"
    folder.mkdir()
    ds.to_netcdf(folder / "c1_limit.nc")
    page, md = build_report(folder, resamples=0)
    assert "class='banner'" not in page and "> **" not in md


def test_sections_follow_the_claims_order_derived_from_each_files_data():
    """The shipped files' experiment, title and first claim give the documented order; a claim
    not of the form C<n> comes after them, another file of an experiment after its own file."""
    from sfxlin.analysis.report import reading_order
    from sfxlin.analysis.verdicts import criteria_from_attrs

    keys = {}
    for path in DATASETS.glob("*.nc"):
        with xr.open_dataset(path) as ds:
            keys[ds.attrs["experiment"]] = reading_order(ds.attrs["experiment"], ds.attrs["title"],
                                                         criteria_from_attrs(ds)[0].claim, path.name)
    if sorted(keys) != sorted(SHIPPED_ORDER):
        pytest.skip(f"datasets/ holds {sorted(keys)}, not the thirteen shipped files")
    assert sorted(keys, key=keys.get) == SHIPPED_ORDER
    walk = reading_order("walk", "A random walk's diffusion constant", "W", "walk.nc")
    again = reading_order("c3_deep", "C3 deep: more seeds", "C3", "c3_deep_more.nc")
    assert max(keys.values()) < again < walk


def test_another_file_of_an_experiment_comes_after_its_own(results, tmp_path):
    folder = tmp_path / "two"
    folder.mkdir()
    shutil.copy(results / "c1_limit.nc", folder / "c1_limit.nc")
    shutil.copy(results / "c1_limit.nc", folder / "a_rerun.nc")  # first by name, second in the report
    page, _ = build_report(folder, resamples=0)
    assert page.index("<h2 id='c1_limit'>") < page.index("<h2 id='a_rerun'>")
    assert "c1_limit (a_rerun.nc)" in page.split("<table class='summary'>")[1].split("</table>")[0]


def test_each_files_verdicts_are_computed_once(results, tmp_path, monkeypatch):
    """Robustness reruns every measure 100 times: the report judges each file once, for both its
    summary row and its section, in both formats."""
    from sfxlin.analysis import c1

    folder = tmp_path / "two"
    folder.mkdir()
    for name in ("c1_limit.nc", "c1_more.nc"):
        shutil.copy(results / "c1_limit.nc", folder / name)
    calls = []
    real = c1.CRITERIA.verdicts

    def counted(ds, inconclusive=None, *, resamples=100):
        calls.append(resamples)
        return real(ds, inconclusive, resamples=resamples)

    monkeypatch.setattr(c1, "verdicts", counted)
    judged = []
    write_report(folder, tmp_path / "r.html", resamples=2, on_verdicts=lambda path, rows: judged.append(path.name))
    assert calls == [2, 2] and sorted(judged) == ["c1_limit.nc", "c1_more.nc"]


def _tiny_png():
    import matplotlib

    matplotlib.use("Agg")
    import io

    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(0.2, 0.2))
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def test_a_report_of_the_shipped_files_fits_a_1280_px_page(tmp_path, monkeypatch):
    """The report of datasets/*.nc (the paper files: the widest tables there are) in headless
    Chromium at 1280 px: the page does not scroll sideways, no element's right edge passes the
    viewport, and no table is wider than its box (none hides columns behind a scroll bar). The
    figures (img max-width 100%) are replaced by a tiny PNG and the robustness by one resample
    (its column at full width), to keep the test short: neither is what is measured."""
    import sfxlin.analysis.report as report

    _require_chromium()
    if not list(DATASETS.glob("*.nc")):
        pytest.skip("no results files in datasets/")
    monkeypatch.setattr(report, "_figure_png", lambda module, ds: _tiny_png())
    skipped = []
    page = build_report(DATASETS, lambda path, why: skipped.append((path.name, why)), resamples=1)[0]
    assert skipped == []
    probe = ("<script>window.onload=()=>{const w=document.documentElement.clientWidth;const out=[];"
             "for(const e of document.body.querySelectorAll('*')){const r=e.getBoundingClientRect();"
             "if(r.right>w+0.5)out.push(e.tagName+'.'+e.className+'@'+Math.round(r.right))}"
             "for(const b of document.querySelectorAll('.fit-scroll')){if(b.scrollWidth>b.clientWidth)"
             "out.push('box of '+(b.closest('.fit-table')||b).textContent.slice(0,60)+' by '+"
             "(b.scrollWidth-b.clientWidth)+' px')}"
             "document.title=document.documentElement.scrollWidth+':'+w+':'+out.length+':'+out.slice(0,8).join(',')}"
             "</script></body>")
    title = re.search(r"<title>(\d+):(\d+):(\d+):(.*?)</title>", _dump_dom(page.replace("</body>", probe), tmp_path,
                                                                         1280))
    assert title, "no layout measured"
    page_width, viewport, n_out, which = title.groups()
    assert int(page_width) <= 1280 and int(viewport) <= 1280, (page_width, viewport)
    assert n_out == "0", f"{n_out} elements pass the {viewport} px viewport or their box: {which}"


# --------------------------------------------------------------------------------------------
# the answer per claim at the top
# --------------------------------------------------------------------------------------------
def _row(cid, verdict, fails_as=None, note=""):
    from sfxlin.analysis.verdicts import Criterion, VerdictRow

    crit = Criterion(id=cid, claim=cid.split("-")[0], description="a figure", kind="<", threshold=1.0)
    return VerdictRow(crit, 0.5, "0.5", verdict, note, fails_as=fails_as)


def _section(experiment, title, claim, rows):
    from sfxlin.analysis.report import reading_order

    return {"experiment": experiment, "claims": [claim], "rows": rows,
            "order": reading_order(experiment, title, claim, f"{experiment}.nc")}


def test_claims_are_grouped_as_the_report_orders_them_and_each_gets_its_answer():
    """A claim's own experiments, a claim id of its own and a claim's extensions are three groups, in
    reading order; the answer follows the classes of its FAILs (one word per case: holds, holds where
    judged, holds but for pre-asymptotic or colloquial FAILs, holds in part, open), and the sentence names
    every FAIL and INCONCLUSIVE by class."""
    from sfxlin.analysis.report import claim_answer, claim_groups, claim_sentence, class_line

    pre, find = ("pre-asymptotic", "not yet 1/L"), ("finding", "it does not")
    sections = [
        _section("c9_ext", "C9 kernels: more", "C9", [_row("C9K-a", "PASS"), _row("C9K-b", "FAIL", pre)]),
        _section("c9_limit", "C9: the claim", "C9", [_row("C9-a", "PASS"), _row("C9-b", "INCONCLUSIVE", pre, "few L")]),
        _section("c9_own", "C9 own: its own id", "C9O", [_row("C9O-a", "FAIL", note="")]),
        _section("c9_more", "C9: the claim again", "C9", [_row("C9-c", "FAIL", find), _row("C9-d", "NOT JUDGED")]),
    ]
    sections.sort(key=lambda sec: sec["order"])
    groups = claim_groups(sections)
    assert [(label, [s["experiment"] for s in secs]) for label, secs in groups] == [
        ("C9", ["c9_limit", "c9_more"]), ("C9O", ["c9_own"]), ("C9, extensions", ["c9_ext"])]
    assert claim_sentence(*groups[0]) == ("C9 (c9_limit, c9_more): holds in part: 1 FAIL is a finding — 1 PASS, "
                                          "1 FAIL (finding: C9-c), 1 INCONCLUSIVE (pre-asymptotic: C9-b), "
                                          "1 NOT JUDGED.")
    assert claim_sentence(*groups[1]) == "C9O (c9_own): open: 1 FAIL unclassified — 0 PASS, 1 FAIL (unclassified: C9O-a)."
    assert claim_sentence(*groups[2]).startswith("C9, extensions (c9_ext): holds but for FAILs that are "
                                                 "pre-asymptotic or colloquial readings — 1 PASS, 1 FAIL")
    assert claim_answer([_row("C9-a", "PASS")]) == "holds"
    assert claim_answer([_row("C9-a", "PASS"), _row("C9-b", "INCONCLUSIVE", pre)]) == "holds where judged"
    assert claim_answer([_row("C9-d", "NOT JUDGED")]) == "not judged"
    every = [r for sec in sections for r in sec["rows"]]
    assert class_line(every) == "3 FAIL by class: 1 finding, 1 pre-asymptotic, 0 colloquial reading, 1 unclassified"


def test_the_top_of_the_report_answers_per_claim_and_lists_every_fail_and_inconclusive(results, monkeypatch):
    """In both formats, before the summary table: the claim's sentence, the FAILs by class, and a table of
    every FAIL and INCONCLUSIVE with its class, reason and note; a FAIL whose criterion declares no class
    is shown as unclassified (at the top and in its section), never as an empty cell; the multiplicity
    line counts every FAIL before it speaks of the tests."""
    from sfxlin.analysis import c1
    from sfxlin.analysis.report import class_line
    from sfxlin.analysis.verdicts import multiplicity_line

    rows = [_row("C1-good", "PASS"), _row("C1-bare", "FAIL"),
            _row("C1-slow", "FAIL", ("pre-asymptotic", "the rate is not reached at L = 64")),
            _row("C1-few", "INCONCLUSIVE", ("pre-asymptotic", "two L only"), "needs >= 3 prompt lengths")]
    monkeypatch.setattr(c1, "verdicts", lambda ds, resamples=None: rows)
    page, md = build_report(results)
    top = page.split("<h2 id='summary'>What holds</h2>")[1].split("<h2 ")[0]
    sentence = ("C1 (c1_limit): open: 1 FAIL unclassified — 1 PASS, 2 FAIL (pre-asymptotic: C1-slow; unclassified: "
                "C1-bare), 1 INCONCLUSIVE (pre-asymptotic: C1-few).")
    assert top.index(html_escape(sentence)) < top.index(html_escape(class_line(rows))) < top.index("class='summary'")
    assert class_line(rows) == "2 FAIL by class: 0 finding, 1 pre-asymptotic, 0 colloquial reading, 1 unclassified"
    listed = top.split("<h3 id='open'>Every FAIL and INCONCLUSIVE</h3>")[1]
    assert [re.findall(r"<td class='id'>(.*?)</td>", line)[0] for line in listed.split("</tr>")[1:-1]] == \
        ["C1-bare", "C1-slow", "C1-few"]
    assert "<td class='unclassified'>unclassified</td>" in listed.split("</tr>")[1]
    assert "<td>the rate is not reached at L = 64</td>" in listed and "<td>needs &gt;= 3 prompt lengths</td>" in listed
    section = page.split("<h2 id='c1_limit'>")[1]
    assert "<td class='unclassified'>unclassified</td>" in section
    assert f"Over every file: {html_escape(multiplicity_line(rows))}." in top
    assert multiplicity_line(rows).startswith("3 criteria judged, 2 FAIL")
    md_top = md.split("## What holds")[1].split("\n## ")[0]
    assert md_top.index(f"- {sentence}") < md_top.index(class_line(rows)) < md_top.index("| claim | experiment |")
    assert "| C1 | C1-bare | **FAIL** | **unclassified** |  |  |" in md_top
    assert "| C1 | C1-few | **INCONCLUSIVE** | pre-asymptotic | two L only | needs >= 3 prompt lengths |" in md_top
    assert "| C1-bare | 0.5 | < 1 |  | **FAIL** |  | **unclassified** |  |" in md.split("`c1_limit.nc`")[1]
