"""No import cycle between the packages of flashdraft.

Every module under src/flashdraft is parsed (ast; nothing is imported), and each ``import`` /
``from ... import`` of a flashdraft module becomes an edge between top-level packages
(``flashdraft.train.loop`` -> ``flashdraft.models.drafter`` is train -> models). Imports inside
functions count too: a lazy import still ties the two packages together, it only postpones the
failure. ``if TYPE_CHECKING:`` imports are left out: they never run. Top-level modules (``cli``,
``config``, ``io``, ``errors``) are nodes like the packages; ``cli`` may import every verb.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import flashdraft

ROOT = Path(flashdraft.__file__).parent


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit(module: str) -> str | None:
    """flashdraft.X.Y -> X (the top-level package or module); None outside flashdraft or for the root."""
    parts = module.split(".")
    return parts[1] if parts[0] == "flashdraft" and len(parts) > 1 else None


def type_checking_nodes(tree: ast.AST) -> set[int]:
    """ids of the import nodes under ``if TYPE_CHECKING:`` blocks."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def imported_modules(path: Path) -> list[str]:
    """Absolute names of the modules ``path`` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = type_checking_nodes(tree)
    here = module_name(path)
    package = here if path.name == "__init__.py" else here.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            out.append(base)
            out.extend(f"{base}.{a.name}" for a in node.names)  # `from flashdraft import train`
    return out


def package_graph() -> dict[str, set[str]]:
    graph: dict[str, set[str]] = defaultdict(set)
    for path in sorted(ROOT.rglob("*.py")):
        src = unit(module_name(path))
        if src is None:
            continue
        for name in imported_modules(path):
            dst = unit(name)
            if dst is not None and dst != src and ((ROOT / dst).is_dir() or (ROOT / f"{dst}.py").is_file()):
                graph[src].add(dst)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None."""
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return stack[stack.index(m):] + [m]
            if m not in state:
                found = visit(m)
                if found:
                    return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state:
            found = visit(n)
            if found:
                return found
    return None


def test_the_walk_sees_known_edges():
    g = package_graph()
    assert "models" in g["decode"] and "models" in g["train"] and "decode" in g["train"]
    assert {"decode", "train", "bench", "export", "generate", "mix"} <= g["cli"]  # lazy imports inside _register


def test_find_cycle_names_the_packages():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_between_packages():
    cycle = find_cycle(package_graph())
    assert cycle is None, "import cycle between packages: " + " -> ".join(f"flashdraft.{p}" for p in cycle)
