"""Every experiment script reports a bad flag as one line and exit status 2, as the product's commands do: each builds
its parser as ``experiments.harness.one_line.OneLineParser`` (argparse's own prints its usage block first)."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from experiments.harness.one_line import OneLineParser

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(path for path in (ROOT / "experiments").glob("*.py") if path.name != "__init__.py")


def _plain_parsers(path: Path) -> list[int]:
    """Lines where ``path`` builds an ``argparse.ArgumentParser`` (or one imported by that name)."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            if name == "ArgumentParser":
                lines.append(node.lineno)
    return lines


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda path: path.name)
def test_no_experiment_script_builds_a_plain_argparse_parser(path):
    assert _plain_parsers(path) == [], f"{path.name}: use OneLineParser (experiments/harness/one_line.py)"


def test_the_check_finds_a_plain_parser(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text("import argparse\n\nparser = argparse.ArgumentParser()\nparser.parse_args()\n")
    assert _plain_parsers(script) == [3]


def test_a_bad_flag_is_one_line_and_exit_2(capsys):
    parser = OneLineParser(prog="demo")
    parser.add_argument("--steps", type=int, default=1)
    with pytest.raises(SystemExit) as stop:
        parser.parse_args(["--steps", "many"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == "demo: error: argument --steps: invalid int value: 'many'\n"


@pytest.mark.parametrize("name", ["bench_core", "timeline"])
@pytest.mark.slow
def test_a_converted_script_run_from_elsewhere_prints_one_line(name, tmp_path):
    """Run as users run them (``python experiments/NAME.py`` from any folder): the harness import resolves."""
    done = subprocess.run([sys.executable, str(ROOT / "experiments" / f"{name}.py"), "--no-such-flag"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr == f"{name}.py: error: unrecognized arguments: --no-such-flag\n"
