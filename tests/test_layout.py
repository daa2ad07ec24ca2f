"""The house's rules that a refactor could break without any numerical test noticing: no module of
sfxlin reaches into another module's underscore names (what several modules need is public, in
the module whose job it is)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FOLDERS = ("sfxlin", "pipelines", "analysis", "benchmarks")


def _private(name):
    return name.startswith("_") and not name.startswith("__")


def _ours(module, level):
    """A relative import, or an absolute one of the project's own packages."""
    return level > 0 or (module or "").split(".")[0] == "sfxlin"


def reach_ins(path: Path, root: Path = ROOT) -> list[str]:
    """``file:line what`` for every import of, or attribute access to, another module's private
    name in ``path``: ``from .m import _x`` and ``m._x`` where ``m`` is a module of ours."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and _ours(node.module, node.level):
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{path.relative_to(root)}:{node.lineno} from {node.module} import {alias.name}")
                modules.add(alias.asname or alias.name)   # `from . import icl` binds a module
        elif isinstance(node, ast.Import):
            modules.update(alias.asname or alias.name.split(".")[0] for alias in node.names
                           if alias.name.split(".")[0] == "sfxlin")
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name)
                and node.value.id in modules):
            found.append(f"{path.relative_to(root)}:{node.lineno} {node.value.id}.{node.attr}")
    return found


def test_no_module_reaches_into_another_modules_private_names():
    found = [hit for folder in FOLDERS for path in sorted((ROOT / folder).rglob("*.py")) for hit in reach_ins(path)]
    assert not found, "\n".join(found)


def test_the_check_finds_a_reach_in(tmp_path):
    """The rule's own test: a planted reach-in of each form is reported, a stdlib one is not."""
    source = ("import os\nfrom . import icl\nfrom .attention import _helper\nimport sfxlin.laws as laws\n"
              "icl._as_sigma(1)\nlaws._check_D(2)\nos._exit\n")
    path = tmp_path / "planted.py"
    path.write_text(source)
    assert reach_ins(path, tmp_path) == ["planted.py:3 from attention import _helper", "planted.py:5 icl._as_sigma",
                                         "planted.py:6 laws._check_D"]


def _imported(path: Path, package: str) -> set[str]:
    """Absolute names of the project modules ``path`` (a module of ``package``) imports."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
                names |= {module} if node.module else {f"{module}.{a.name}" for a in node.names}
            elif (node.module or "").startswith("sfxlin"):
                names.add(node.module)
        elif isinstance(node, ast.Import):
            names |= {a.name for a in node.names if a.name.startswith("sfxlin")}
    return names


def _layer(module: str) -> int:
    """0 the mathematics, 1 the engine, 2 pipelines and analysis, 3 the command line and its Python face
    (``sfxlin.runs``: a run judged by its analysis)."""
    if module.startswith(("sfxlin.pipelines", "sfxlin.analysis", "sfxlin.benchmarks")):
        return 2
    if module.startswith("sfxlin.engine"):
        return 1
    if module in ("sfxlin.cli", "sfxlin.runs"):
        return 3
    return 0


def test_imports_go_one_way_mathematics_engine_experiments_cli():
    """The mathematics imports nothing of the engine, the engine nothing of the experiments (it
    finds them by name at run time: sfxlin.engine.experiments), none of them the command line.
    The package's face (sfxlin/__init__.py) and the test helpers (sfxlin.testing) may re-export
    from every layer."""
    wrong = []
    for path in sorted((ROOT / "sfxlin").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) == 2 or parts[1] == "testing":
            continue
        module = ".".join(p for p in parts if p != "__init__")
        package = module if parts[-1] == "__init__" else module.rpartition(".")[0]
        for name in _imported(path, package):
            allowed = name == "sfxlin.pipelines" and module == "sfxlin.engine.experiments"
            if _layer(name) > _layer(module) and not allowed:
                wrong.append(f"{module} imports {name}")
    assert not wrong, "\n".join(wrong)
