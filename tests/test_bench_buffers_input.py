"""experiments/bench_buffers.py refuses, in one line and before any run, a --out that holds an earlier sitting."""
from pathlib import Path

from tests.in_process import run_in_process

SCRIPT = Path(__file__).resolve().parent.parent / "experiments" / "bench_buffers.py"


def test_an_out_folder_with_an_earlier_sittings_runs_is_refused_before_any_run(tmp_path):
    (tmp_path / "sync-none-0.jsonl").write_text("{}\n")
    (tmp_path / "pipe-none-0.jsonl").write_text("{}\n")
    done = run_in_process(SCRIPT, "--out", str(tmp_path))
    assert done.returncode == 2, done.stderr
    assert "--out" in done.stderr and "already holds an earlier sitting's runs (pipe-none-0.jsonl and 1 more)" \
        in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe-none-0.jsonl", "sync-none-0.jsonl"]
