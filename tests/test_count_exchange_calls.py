"""experiments/count_exchange_calls.py: a tiny run on 3 and 4 gloo ranks counts the exchange's calls per bucket, and
one more peer adds at most the sum's add (before the batched copies: 8.8, 13.2 and 17.5 kernels per extra peer for
q8, q8 with feedback and sign with it, p = 2 to 8, experiments/results/bench_host/exchange_calls-b436daa.md); bad
input exits 2 with one line before any rank starts (the counts are its committed result, exchange_calls.md)."""
from __future__ import annotations

import pytest

from tests.in_process import run_in_process
from tests.test_gpu_scripts import ROOT, run_script


def run(*args: str):
    return run_script("count_exchange_calls.py", *args, timeout_s=240)


@pytest.mark.slow
def test_one_more_peer_adds_at_most_the_sums_add(tmp_path):
    done = run("--ranks", "3,4", "--codecs", "q8,q8+ef,sign+ef", "--out", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    text = (tmp_path / "exchange_calls.md").read_text()
    assert "- command: " in text and "- commit: " in text
    header = next(line for line in text.splitlines() if line.startswith("| path |")).strip("| ").split(" | ")
    rows = [dict(zip(header, line.strip("| ").split(" | "))) for line in text.splitlines()
            if line.startswith(("| direct |", "| staged |"))]
    assert [(r["path"], r["p"], r["codec"]) for r in rows] == [
        (path, p, c) for path in ("direct", "staged") for c in ("q8", "q8+ef", "sign+ef") for p in ("3", "4")]
    for low, high in zip(rows[0::2], rows[1::2]):
        if low["codec"] != "sign+ef":  # q8's encodes: the p-1 chunks in one call, the sum in one
            assert low["encoder amax"] == high["encoder amax"] == "2", rows
        assert int(high["kernels"]) - int(low["kernels"]) <= 1, rows
        assert float(high["kernels per extra peer"]) <= 1.0 and float(high["calls per extra peer"]) <= 8.0, rows


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    for args, says in ((["--ranks", "1"], "must be >= 2"), (["--ranks", "2,x"], "comma-separated whole numbers"),
                       (["--codecs", "q9"], "unknown codec q9"), (["--model", "vgg"], "unknown model vgg"),
                       (["--paths", "nccl"], "unknown path nccl")):
        done = run_in_process(ROOT / "experiments" / "count_exchange_calls.py", *args, "--out", str(tmp_path / "never"))
        assert done.returncode == 2 and says in done.stderr, (args, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "never").exists()
