"""An experiment's own code: the modules it imports, directly or not, that are neither the standard
library, nor installed packages, nor ``sfxlin`` (:func:`import_closure`), which the cell store
fingerprints (:func:`sfxlin.engine.cellstore.code_fingerprint`), so that editing a helper module of
an experiment declared outside the package recomputes its cells."""
from __future__ import annotations

import ast
import collections
import importlib.util
import os
import sysconfig
from pathlib import Path

__all__ = ["import_closure", "in_sfxlin"]


def import_closure(modules) -> dict:
    """``{module name: source file}``, sorted by name, of ``modules`` and every module they import,
    directly or not, that is the experiment's own code: a ``.py`` file outside the standard library
    and the installed packages (site-packages, dist-packages), not built in, and not in ``sfxlin``
    (hashed whole by :func:`code_fingerprint`). ``modules`` themselves are kept wherever they lie.

    The imports are read from the source (:func:`_imported_names`: every ``import`` statement, at the
    top or inside a function), not run; a module that cannot be found (a missing optional
    dependency) is skipped. Only the own packages are imported, to find their submodules."""
    libraries = _library_folders()
    found, packages, seen = {}, set(), set()
    todo = collections.deque((name, name in modules) for name in _with_parents(modules))
    while todo:
        name, root = todo.popleft()
        if name in seen or in_sfxlin(name):
            continue
        seen.add(name)
        parent = name.rpartition(".")[0]
        if parent and parent not in packages and not root:
            continue   # inside an installed package or a plain module (a parent is queued, so decided, first)
        spec = _find_spec(name)
        if spec is None or not (root or _is_own(spec, libraries)):
            continue
        if spec.submodule_search_locations is not None:
            packages.add(name)
        if spec.has_location and spec.origin.endswith(".py"):
            found[name] = Path(spec.origin)
            package = name if name in packages else parent
            todo.extend((n, False) for n in _imported_names(found[name].read_bytes(), package))
    return dict(sorted(found.items()))


def in_sfxlin(name) -> bool:
    """Whether module ``name`` is ``sfxlin`` or one of its modules."""
    return name == "sfxlin" or name.startswith("sfxlin.")


def _with_parents(names) -> list:
    """``names`` with the packages above each (``a``, ``a.b`` before ``a.b.c``): importing a module
    runs its parents' ``__init__``."""
    return [".".join(parts[:k]) for parts in (n.split(".") for n in names) for k in range(1, len(parts) + 1)]


def _imported_names(source, package) -> list:
    """Every module name an ``import`` anywhere in ``source`` may load, with its parents: relative
    names resolved against ``package``, and ``from pkg import name`` also as the submodule ``pkg.name``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            names += [base, *(f"{base}.{alias.name}" for alias in node.names if alias.name != "*")] if base else []
    return _with_parents(names)


def _absolute(node, package):
    """The absolute module name of a ``from ... import`` node in ``package``, or None for a relative
    import that goes above the top-level package."""
    if not node.level:
        return node.module
    try:
        return importlib.util.resolve_name("." * node.level + (node.module or ""), package)
    except ImportError:
        return None


def _find_spec(name):
    """The import spec of module ``name``, or None where there is none (a missing module)."""
    try:
        return importlib.util.find_spec(name)
    except (ImportError, ValueError):   # ValueError: a module in sys.modules without a spec (__main__)
        return None


def _library_folders() -> tuple:
    """The folders of the standard library and the installed packages, resolved."""
    paths = sysconfig.get_paths()
    return tuple({Path(os.path.realpath(paths[key])) for key in ("stdlib", "platstdlib", "purelib", "platlib")})


def _is_own(spec, libraries) -> bool:
    """Whether the module of ``spec`` is a file (or a namespace package's folders) outside
    ``libraries`` and any site-packages or dist-packages folder: not built in, frozen or installed."""
    places = [spec.origin] if spec.has_location else list(spec.submodule_search_locations or ())
    return bool(places) and not any(_is_installed(Path(os.path.realpath(place)), libraries) for place in places)


def _is_installed(path, libraries) -> bool:
    """Whether ``path`` lies in one of ``libraries`` or in a site-packages or dist-packages folder."""
    return (not {"site-packages", "dist-packages"}.isdisjoint(path.parts)
            or any(path.is_relative_to(folder) for folder in libraries))
