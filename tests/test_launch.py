"""pipesgd.launch and the harness's ``run_on_ranks``: ranks spawned without torchrun report their failures, and a
process ends through ``exit_process`` with its code and all of its output, without the interpreter's teardown
(which can abort after a DDP run: see the function's docstring)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENV = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
ENV["PYTHONPATH"] = str(ROOT)


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=ENV,
                          timeout=120)


@pytest.mark.slow
def test_exit_process_keeps_unflushed_output_and_the_code_and_skips_teardown():
    proc = _python("""
        import atexit, sys
        from pipesgd.launch import exit_process
        atexit.register(lambda: print("teardown ran", flush=True))
        sys.stdout.write("partial line on stdout")  # no newline, no flush: buffered when the process ends
        sys.stderr.write("and on stderr")
        exit_process(3)
        print("after exit")
    """)
    assert proc.returncode == 3
    assert proc.stdout == "partial line on stdout" and proc.stderr == "and on stderr"


SPAWNED = """
import sys
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from experiments.harness.rank_launch import run_on_ranks

def job(rank, world, fail_rank):
    model = DDP(torch.nn.Linear(4, 2))
    model(torch.ones(3, 4)).sum().backward()
    if rank == fail_rank:
        raise RuntimeError(f"rank {rank} gave up")
    print(f"rank {rank} done", flush=True)

if __name__ == "__main__":
    run_on_ranks(job, 2, int(sys.argv[1]))
"""


@pytest.mark.slow
@pytest.mark.parametrize("fail_rank", [-1, 1])
def test_spawned_ranks_after_ddp_end_with_their_outcome(tmp_path, fail_rank):
    # A DDP module keeps its process group alive past destroy_process_group; ranks that finish still exit 0 and
    # the parent returns, while a rank that raises still fails the launch with its message.
    script = tmp_path / "spawned.py"
    script.write_text(SPAWNED)
    proc = subprocess.run([sys.executable, str(script), str(fail_rank)], capture_output=True, text=True, env=ENV,
                          timeout=120)
    if fail_rank < 0:
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert sorted(re.findall(r"rank \d done", proc.stdout)) == ["rank 0 done", "rank 1 done"]  # lines may interleave
    else:
        assert proc.returncode != 0 and "RuntimeError: rank 1 gave up" in proc.stderr
        assert "rank 1 done" not in proc.stdout
