"""The shape the redesign keeps (issue 9): the analytic model loads without torch, its modules import no circle,
and every module of pipesgd/ and timing_model/ opens with a docstring and stays under 400 lines."""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 400


def _modules(package: str) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``package`` (a package is its ``__init__``)."""
    out = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules of ``known`` that ``name`` imports anywhere in its file (module level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import sub` imports the sub-module when there is one, else a name of pkg
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        found |= {t for t in targets if t in known and t != name}
    return found


def test_the_timing_model_loads_without_torch():
    code = ("import importlib, pkgutil, sys, timing_model\n"
            "for m in pkgutil.walk_packages(timing_model.__path__, 'timing_model.'):\n"
            "    if m.name != 'timing_model.__main__': importlib.import_module(m.name)\n"
            "print(sorted(n for n in sys.modules if n.split('.')[0] == 'torch' or n.startswith('pipesgd')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    loaded = set(eval(done.stdout))  # noqa: S307 - our own subprocess printed a list of names
    assert not any(n.split(".")[0] == "torch" for n in loaded)
    assert loaded <= {"pipesgd", "pipesgd.defaults", "pipesgd.run_files"}  # the torch-free owners only


def test_no_module_of_the_timing_model_imports_one_that_imports_it_back():
    known = _modules("timing_model")
    graph = {name: _imports(name, path, known) for name, path in known.items()}
    assert "timing_model.commands.flags" in graph["timing_model.commands.sweep"]  # the walk sees imports

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), [start]
        while todo:
            for nxt in graph[todo.pop()] - seen:
                if nxt == goal:
                    return True
                seen.add(nxt)
                todo.append(nxt)
        return False

    circles = [(a, b) for a in graph for b in graph[a] if reaches(b, a)]
    assert circles == []


def test_every_module_opens_with_a_docstring_and_stays_small():
    for package in ("pipesgd", "timing_model"):
        for name, path in _modules(package).items():
            text = path.read_text()
            assert ast.get_docstring(ast.parse(text)), f"{name}: no module docstring"
            assert text.count("\n") <= MAX_LINES, f"{name}: {text.count(chr(10))} lines (split before {MAX_LINES})"
