"""The files generated from the experiments' declarations, and the command that keeps them::

    python -m sfxlin.testing.generate            # exit 1, with a diff, when a committed file is out of date
    python -m sfxlin.testing.generate --write    # rewrite them from the declarations

run from the repository's root (or ``--root DIR``). They are

* ``tests/criteria_pins.json``: every criterion's id, claim, kind and thresholds (:mod:`.pins`);
* ``docs/criteria.md``: its criteria tables, the prose around them kept (:mod:`.criteria_doc`).

Their tests (tests/test_criteria_pinned.py, tests/test_criteria_doc.py) compare each committed file
with a fresh generation (:func:`difference`) and fail with the diff and this command.
"""
from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path

from . import criteria_doc, pins

__all__ = ["COMMAND", "GENERATED", "difference", "generated", "main"]

COMMAND = "python -m sfxlin.testing.generate --write"

#: ``{path relative to the repository's root: generate(committed text or None) -> text}``
GENERATED = {pins.PATH: pins.pins_text, criteria_doc.PATH: criteria_doc.criteria_doc}


def generated(root: Path, path: str) -> str:
    """The text ``path`` should hold under ``root``, generated from the declarations."""
    file = Path(root) / path
    return GENERATED[path](file.read_text() if file.exists() else None)


def difference(root: Path, path: str) -> str:
    """The unified diff from the committed ``path`` to its generation (``""``: up to date)."""
    file = Path(root) / path
    committed = file.read_text() if file.exists() else ""
    return "".join(difflib.unified_diff(committed.splitlines(keepends=True),
                                        generated(root, path).splitlines(keepends=True),
                                        fromfile=f"{path} (committed)", tofile=f"{path} (generated)"))


def main(argv=None) -> int:
    """The command line; returns the exit status (1: a file is out of date and ``--write`` was not given)."""
    parser = argparse.ArgumentParser(prog="python -m sfxlin.testing.generate", description=__doc__.split("\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the files that are out of date")
    parser.add_argument("--root", type=Path, default=Path.cwd(), help="the repository's root (default: .)")
    args = parser.parse_args(argv)
    if not (args.root / "docs").is_dir() or not (args.root / "tests").is_dir():
        parser.error(f"{args.root} is not the repository's root (no docs/ and tests/): pass --root")
    stale = 0
    for path in GENERATED:
        diff = difference(args.root, path)
        if not diff:
            print(f"{path}: up to date")
        elif args.write:
            (args.root / path).write_text(generated(args.root, path))
            print(f"{path}: written")
        else:
            print(diff, end="")
            stale += 1
    if stale:
        print(f"{stale} file(s) out of date: {COMMAND}", file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
