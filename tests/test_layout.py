"""The package's folders name the pipeline's steps, and imports run one way, down it (docs/layout.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import gradfuse

PACKAGE = Path(gradfuse.__file__).parent
# In the pipeline's order: a step imports only earlier ones (generate/ writes an answer for reading/'s answer path)
STEPS = ("ingest", "embedding", "sources", "indexing", "federation", "selection", "fusion", "rerank", "generate",
         "reading")
SHARED = ("candidate", "checked", "folders", "hardware", "loading", "redact", "access", "lm",
          "ray_cluster")  # beneath every step
SHELLS = ("cli", "server", "integrations")
SHELL_SETTINGS = "gradfuse.server.settings"  # config.py reads `[server]`'s settings, and nothing else of a shell


def _imports(path: Path) -> set[str]:
    """Every gradfuse module `path` imports, at its top or inside a function (a lazy import is still a dependency)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("gradfuse"):
            found |= {node.module} if node.module != "gradfuse" else {f"gradfuse.{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("gradfuse")}
    return found


def _by_module() -> dict[str, set[str]]:
    return {".".join(path.relative_to(PACKAGE).with_suffix("").parts): _imports(path)
            for path in PACKAGE.rglob("*.py")}


def _part(module: str) -> str:
    return module.removeprefix("gradfuse.").split(".")[0]


def test_no_step_imports_a_later_one():
    wrong = [f"{module} imports {imported}" for module, imports in _by_module().items() if _part(module) in STEPS
             for imported in imports
             if _part(imported) in STEPS and STEPS.index(_part(imported)) > STEPS.index(_part(module))]
    assert not wrong, wrong


def test_nothing_below_the_shells_imports_one():
    wrong = [f"{module} imports {imported}" for module, imports in _by_module().items()
             if _part(module) not in SHELLS and module != "__init__"
             for imported in imports if _part(imported) in SHELLS and imported != SHELL_SETTINGS]
    assert not wrong, wrong


def test_what_every_step_shares_imports_no_step_nor_shell():
    wrong = [f"{module} imports {imported}" for module, imports in _by_module().items() if _part(module) in SHARED
             for imported in imports if _part(imported) in STEPS + SHELLS]
    assert not wrong, wrong
