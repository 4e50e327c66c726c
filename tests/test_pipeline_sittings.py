"""experiments/pipeline_sittings.py: bench_pipeline sittings per setting summarised (mean, range, paired ratios), on
synthetic result files; bad files refused in one line."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from experiments.pipeline_sittings import read_sittings, summary
from tests.in_process import run_in_process
from tests.test_bench_pipeline import ENV, ROOT


def _write(tmp_path, name: str, iterations_ms: dict[str, float], efficiency: float = 0.9) -> str:
    records = [{"workload": "mlp1.9m", "variant": variant, "t_iter": ms / 1e3, "efficiency": efficiency}
               for variant, ms in iterations_ms.items()]
    path = tmp_path / name
    path.write_text(json.dumps({"where": "w", "records": records}))
    return str(path)


def test_each_setting_gets_mean_and_range_and_the_first_over_the_others_paired_by_sitting(tmp_path):
    paths = [_write(tmp_path, "exchange-s0.json", {"q8": 110.0, "sign+ef": 60.0}, 0.8),
             _write(tmp_path, "exchange-s1.json", {"q8": 130.0, "sign+ef": 80.0}, 1.0),
             _write(tmp_path, "ring-s0.json", {"q8": 100.0, "sign+ef": 80.0}),
             _write(tmp_path, "ring-s1.json", {"q8": 100.0, "sign+ef": 80.0})]
    settings = read_sittings(paths)
    assert list(settings) == ["exchange", "ring"] and sorted(settings["ring"]) == [0, 1]
    table = summary(settings).splitlines()
    assert table[0].startswith("| workload | variant | exchange: iteration ms") and "exchange / ring" in table[0]
    assert table[2] == ("| mlp1.9m | q8 | 120.0 (110.0-130.0), 0.90 (0.80-1.00) (2) | 100.0 (100.0-100.0), "
                        "0.90 (0.90-0.90) (2) | 1.20, 1.10-1.30 |")
    assert table[3].endswith("| 0.88, 0.75-1.00 |")


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "pipeline_sittings.py"), *args],
                          capture_output=True, text=True, env=ENV, timeout=120)


@pytest.mark.slow
def test_the_script_writes_the_table_with_its_provenance_and_refuses_bad_files_in_one_line(tmp_path):
    a, b = _write(tmp_path, "a-s0.json", {"q8": 100.0}), _write(tmp_path, "b-s0.json", {"q8": 50.0})
    out = tmp_path / "summary.md"
    done = _run(a, b, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "| mlp1.9m | q8 |" in done.stdout and "| 2.00, 2.00-2.00 |" in done.stdout
    assert out.read_text().startswith("# Pipe-SGD iterations over sittings: a, b\n") and "- commit: " in out.read_text()
    badly_named = tmp_path / "a.json"
    badly_named.write_text("{}")
    empty = tmp_path / "c-s0.json"
    empty.write_text(json.dumps({"records": []}))
    for path, message in ((badly_named, "not named NAME-sK.json"), (empty, "no records"),
                          (tmp_path / "gone-s0.json", "No such file")):
        # a refusal in-process (tests/in_process.py); the run above is the real process users start
        done = run_in_process(ROOT / "experiments" / "pipeline_sittings.py", str(path), "--out",
                              str(tmp_path / "never.md"))
        lines = done.stderr.strip().splitlines()
        assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
        assert not (tmp_path / "never.md").exists()
