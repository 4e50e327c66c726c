"""Committed results carry their provenance and are found from the repository root or notebooks/."""
import json
import os

import pytest

from experiments.harness.provenance import find_results, markdown_header, provenance, read_result, write_result


def test_provenance_names_command_date_machine_commit():
    origin = provenance(["python", "experiments/x.py", "--flag", "a b"])
    assert origin["command"] == "python experiments/x.py --flag 'a b'"
    assert origin["date"].endswith("Z") and len(origin["date"]) == 20
    assert origin["machine"]["cores"] == os.cpu_count()
    assert origin["commit"]  # a hash (maybe +dirty) in a checkout, "unknown" elsewhere


def test_a_markdown_result_opens_with_its_title_and_provenance():
    origin = {"command": "python x.py --n 2", "date": "2026-01-02T03:04:05Z", "commit": "abc123+dirty",
              "machine": {"cpu": "EPYC", "cores": 2}}
    assert markdown_header("Reduction error", origin).splitlines() == [
        "# Reduction error", "", "- command: `python x.py --n 2`", "- date: 2026-01-02T03:04:05Z",
        "- machine: cpu EPYC, cores 2", "- commit: abc123+dirty"]


def test_write_then_read_round_trip_and_refuses_foreign_files(tmp_path):
    path = tmp_path / "r.json"
    write_result(str(path), {"rows": [1, 2]}, origin={"command": "c"})
    data = read_result(str(path))
    assert data == {"provenance": {"command": "c"}, "rows": [1, 2]}
    with pytest.raises(ValueError, match="already has"):
        write_result(str(path), {"provenance": 1})
    foreign = tmp_path / "f.json"
    foreign.write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="no 'provenance'"):
        read_result(str(foreign))


def test_find_results_from_a_subfolder(tmp_path):
    target = tmp_path / "experiments" / "results" / "x"
    target.mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    assert find_results("x", str(tmp_path / "notebooks")) == str(target)
    assert find_results("x", str(tmp_path)) == str(target)
    with pytest.raises(FileNotFoundError, match="experiments/results/y"):
        find_results("y", str(tmp_path / "notebooks"))


def test_a_result_being_rewritten_does_not_make_its_commit_dirty(tmp_path, monkeypatch):
    import shutil
    import subprocess

    from experiments.harness import provenance as module

    if shutil.which("git") is None:
        pytest.skip("git is not installed")

    def git(*args):
        subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=tmp_path, check=True,
                       capture_output=True)

    result, code = tmp_path / "experiments" / "results" / "runs.json", tmp_path / "pipesgd" / "a.py"
    for path in (result, code):
        path.parent.mkdir(parents=True)
        path.write_text("0")
    git("init", "-q")
    git("add", "-A")
    git("commit", "-qm", "one")
    monkeypatch.setattr(module, "_CHECKOUT", str(tmp_path))
    head = module._commit()
    assert len(head) == 12 and "+" not in head
    result.write_text("1")  # the first line of `git status --porcelain` is " M experiments/results/runs.json"
    assert module._commit() == head
    code.write_text("1")
    assert module._commit() == head + "+dirty"
