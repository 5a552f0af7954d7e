"""The import graph of the package (every import statement, module-level or inside a function): no
circles, and the lines of docs/architecture.md never crossed."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: package folder -> the module name it is installed as
TREES = {ROOT / "asp_gmm": "asp_gmm", ROOT / "tuning_db": "asp_gmm.tuning_db"}


def _modules() -> dict:
    """module name -> source path."""
    out = {}
    for folder, name in TREES.items():
        for path in folder.rglob("*.py"):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = path
    return out


MODULES = _modules()


def _is_package(mod: str) -> bool:
    return MODULES[mod].name == "__init__.py"


def _imports(mod: str) -> set:
    """Project modules ``mod`` imports (``from pkg import sub`` counts as ``pkg.sub`` where that
    is a module, else as ``pkg``)."""
    tree = ast.parse(MODULES[mod].read_text())
    base = mod if _is_package(mod) else mod.rpartition(".")[0]
    got = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = base.split(".")
                target = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            names = [f"{target}.{a.name}" if f"{target}.{a.name}" in MODULES else target for a in node.names]
        else:
            continue
        for n in names:
            while n and n not in MODULES:  # asp_gmm.x.y where y is a name: the module asp_gmm.x
                n = n.rpartition(".")[0]
            if n and n != mod:
                got.add(n)
    return got


GRAPH = {m: _imports(m) for m in MODULES}


def _reaches(start: str, goal: str) -> list | None:
    """A path of imports from ``start`` to ``goal`` (or None)."""
    seen, stack = set(), [(start, [start])]
    while stack:
        m, path = stack.pop()
        for n in sorted(GRAPH[m]):
            if n == goal:
                return path + [n]
            if n not in seen:
                seen.add(n)
                stack.append((n, path + [n]))
    return None


def test_the_graph_is_read():
    assert "asp_gmm.fit.passes" in MODULES and "asp_gmm.tuning_db.store" in MODULES
    assert "asp_gmm.fit.stats" in GRAPH["asp_gmm.fit.passes"]
    assert "asp_gmm.reference" in GRAPH["asp_gmm.fit.stats"]


def test_no_import_circles():
    circles = set()
    for m in MODULES:
        path = _reaches(m, m)
        if path is not None:
            circles.add(" -> ".join(path))
    assert not circles, "import circles:\n" + "\n".join(sorted(circles))


def test_lines_never_crossed():
    face = {"asp_gmm.gmm", "asp_gmm.sklearn_api"}
    crossed = []
    for m, deps in GRAPH.items():
        if m.startswith("asp_gmm.backends") and deps & (face | {"asp_gmm", "asp_gmm.fit"}):
            crossed.append(f"{m} (a backend) imports {sorted(deps & (face | {'asp_gmm', 'asp_gmm.fit'}))}")
        if m.startswith("asp_gmm.backends") and any(d.startswith("asp_gmm.fit.") for d in deps):
            crossed.append(f"{m} (a backend) imports the fitting wing")
        if m.startswith("asp_gmm.tuning_db") and any(not d.startswith("asp_gmm.tuning_db") for d in deps):
            crossed.append(f"{m} (the history) imports {sorted(deps)}")
        if m == "asp_gmm.reference" and deps:
            crossed.append(f"asp_gmm.reference imports {sorted(deps)}")
        if m != "asp_gmm" and "asp_gmm" in deps and m not in face:
            crossed.append(f"{m} imports the package's __init__ (the Face)")
        if m.startswith("asp_gmm.selection") and deps & (face | {"asp_gmm.specializer", "asp_gmm.runtime"}):
            crossed.append(
                f"{m} (selection) imports {sorted(deps & (face | {'asp_gmm.specializer', 'asp_gmm.runtime'}))}"
            )
    assert not crossed, "\n".join(crossed)


def test_no_module_over_600_lines():
    long = {m: n for m, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 600}
    assert not long, long
