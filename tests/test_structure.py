"""The layout rules of STYLE.md, checked on the source: every module says what it is for, none grows past
400 lines, no two modules import each other (directly or around a circle), and the analytic timing model
loads without torch."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("pipesgd", "timing_model")
MAX_LINES = 400


def _modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the packages."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


MODULES = _modules()


def _imported(name: str, path: Path) -> set[str]:
    """The package modules ``name`` imports anywhere in its body (inside functions and under ``TYPE_CHECKING``
    too: a circle of type-only imports is still two modules that need each other), resolved to the modules that
    exist."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets.add(module)
            targets.update(f"{module}.{alias.name}" for alias in node.names)  # "from pkg import submodule"
    return {t for t in targets if t in MODULES and t != name}


def _cycle() -> list[str] | None:
    """One import circle among the package modules, or None."""
    graph = {name: _imported(name, path) for name, path in MODULES.items()}
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            # A package's __init__ importing its own submodules (and them importing siblings through it)
            # is how packages are built; only circles between modules count.
            if nxt == node.rpartition(".")[0] or node == nxt.rpartition(".")[0]:
                continue
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for name in graph:
        if name not in state and (found := visit(name)):
            return found
    return None


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_opens_with_a_docstring(name):
    tree = ast.parse(MODULES[name].read_text())
    if not tree.body and MODULES[name].name == "__init__.py":
        pytest.skip("empty package marker")
    docstring = ast.get_docstring(tree)
    assert docstring and docstring.strip(), f"{MODULES[name]} does not open with a docstring saying what it is for"


def test_no_module_over_400_lines():
    long = {str(path.relative_to(ROOT)): n for path in MODULES.values()
            if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (split by concept): {long}"


def test_no_import_circles():
    assert _cycle() is None, "import circle: " + " -> ".join(_cycle() or [])


@pytest.mark.parametrize("b_imports_a", ["def f():\n    from pipesgd import a\n",
                                         "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipesgd import a\n"],
                         ids=["inside-a-function", "type-only"])
def test_cycle_finder_finds_a_circle(monkeypatch, tmp_path, b_imports_a):
    """The checker itself: two modules that import each other are reported, type-only imports too."""
    (tmp_path / "a.py").write_text('"""a"""\nfrom pipesgd import b\n')
    (tmp_path / "b.py").write_text('"""b"""\n' + b_imports_a)
    monkeypatch.setattr(sys.modules[__name__], "MODULES",
                        {"pipesgd.a": tmp_path / "a.py", "pipesgd.b": tmp_path / "b.py"})
    assert _cycle() in (["pipesgd.a", "pipesgd.b", "pipesgd.a"], ["pipesgd.b", "pipesgd.a", "pipesgd.b"])


def test_the_timing_model_loads_without_torch():
    """The analytic model is pure: every one of its modules imports with neither torch nor pipesgd importable."""
    code = ("import importlib, pkgutil, sys\n"
            "class Refuse:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] in ('torch', 'pipesgd'): raise ImportError(f'{name} refused')\n"
            "sys.meta_path.insert(0, Refuse())\n"
            "import timing_model\n"
            "for m in pkgutil.walk_packages(timing_model.__path__, 'timing_model.'):\n"
            "    if m.name != 'timing_model.__main__': importlib.import_module(m.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] in ('torch', 'pipesgd')))")
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    loaded = set(ast.literal_eval(done.stdout.strip()))
    assert not loaded, loaded


def test_no_timing_model_module_imports_pipesgd():
    """One-way dependencies (STYLE.md 18): pipesgd imports the model, never the reverse, not even inside a function
    or under ``TYPE_CHECKING``."""
    offenders = {}
    for name, path in MODULES.items():
        if name.split(".")[0] != "timing_model":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(t.split(".")[0] == "pipesgd" for t in targets):
                offenders.setdefault(name, []).append(node.lineno)
    assert not offenders, f"timing_model modules importing pipesgd (module: lines): {offenders}"
