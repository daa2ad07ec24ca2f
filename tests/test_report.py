"""The offline report: every claim's verdicts, fits, figures (embedded) and provenance."""
import base64
import os
import re
import shutil
import subprocess

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
    page, md = build_report(results)
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
    page, md = build_report(results)
    fits = page.split("<h3>Fits</h3>")[1].split("<img")[0]
    assert "<div class='fit-scroll'><table class='fit'>" in fits and "<pre" not in fits
    assert "paper form L*mse" in fits and "<th>slope</th>" in fits
    md_fits = md.split("### Fits")[1].split("Provenance:")[0]
    assert "```" not in md_fits and "| d | U_norm | slope |" in md_fits


def test_report_figures_are_drawn_from_the_current_file(results, tmp_path):
    """Change the data: the embedded figure changes with it (no stale picture)."""
    first = re.findall(r"base64,([^']+)'", build_report(results)[0])[0]
    moved = tmp_path / "r"
    shutil.copytree(results, moved)
    with xr.open_dataset(moved / "c1_limit.nc") as ds:
        changed = ds.load()
    changed["mse"] = changed.mse * 2
    (moved / "c1_limit.nc").unlink()
    changed.to_netcdf(moved / "c1_limit.nc")
    second = re.findall(r"base64,([^']+)'", build_report(moved)[0])[0]
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
    html_path, _ = write_report(results, tmp_path / "report.html")
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
    page = build_report(results)[0].replace("</body>", table + (
        "<script>window.onload=()=>{const b=[...document.querySelectorAll('.fit-scroll')].pop();"
        "document.title=document.documentElement.scrollWidth+':'+b.scrollWidth+':'+b.clientWidth}</script></body>"))
    assert STYLE in page
    title = re.search(r"<title>(\d+):(\d+):(\d+)</title>", _dump_dom(page, tmp_path, 1280))
    assert title, "no layout measured"
    page_width, content, box = (int(g) for g in title.groups())
    assert page_width <= 1280 and content > box, (page_width, content, box)
