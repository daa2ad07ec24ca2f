"""The install lists every package of the source tree: ``setup.cfg``'s ``packages`` maps each folder
with an ``__init__.py`` under ``sfxlin/``, ``pipelines/``, ``analysis/`` and ``benchmarks/`` (through
``package_dir``), so a non-editable ``pip install .`` holds every module an editable one does (a new
subpackage missing from the list installs without its modules, and only such an install fails)."""
from __future__ import annotations

import configparser
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _listed():
    cfg = configparser.ConfigParser()
    cfg.read(REPO / "setup.cfg")
    roots = dict(line.split(" = ") for line in cfg["options"]["package_dir"].strip().splitlines())
    packages = set(cfg["options"]["packages"].split())
    return roots, packages


def test_every_package_folder_is_listed_in_setup_cfg():
    roots, packages = _listed()
    found = set()
    for name, folder in roots.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            if "examples" in rel.parts or any(part.startswith(".") for part in rel.parts):
                continue
            found.add(".".join([name, *rel.parts]))
    assert found - packages == set(), f"setup.cfg's packages lacks {sorted(found - packages)}"
    assert packages - found == set(), f"setup.cfg lists packages with no folder: {sorted(packages - found)}"
