"""Whether the exchange's CPU work should run on a thread of the training process (today's worker) or in a helper
process of its own, measured side by side in one run: how much each slows the training thread down.

    python experiments/bench_worker_kind.py                 # 1 core (a node with one core of its own) and 2 cores
    python experiments/bench_worker_kind.py --cores 2 --repeats 5

The training thread runs ResNet-20's forward and backward on digits-sized batches (32 of 1x8x8) and an SGD step, as
``pipesgd-train --threads 1`` does. After each backward it hands one job to the worker and, before its next step,
waits for the previous job (width 2). A job is the CPU work one rank does in a two-rank exchange of the model's
gradient with ``--compression`` (encode the chunk the peer owns, decode the peer's payload, sum, encode and settle
the sum, decode the peer's sum: the codec calls of ``pipesgd.comm.alltoall`` with the wire left out), then
``--wire-ms`` of sleep for the bytes in flight. Three variants, interleaved over ``--repeats`` rounds so the machine's
drift hits each alike: ``alone`` (no job: the training thread's own pace), ``thread`` (the job on a thread of the
same process, as ``pipesgd.comm.worker`` runs it) and ``process`` (the job in a spawned process, started with a byte
down a pipe and answered with one: the least a helper process costs, with no gradient copied to it).

With ``--cores 1`` every thread and process is pinned to one core: the job's CPU must then come out of the training
thread's time whichever kind runs it, and only the interpreter lock (a thread) or the process switch (a process) can
differ. With ``--cores 2`` the job has a core of its own: a thread can still hold up the training thread through the
interpreter lock, a process cannot. Prints per variant the training thread's ms per iteration (median over rounds) and
its CPU, the job's CPU, and the slowdown over ``alone``; writes ``report.md`` under ``--out``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from experiments.harness.one_line import OneLineParser, known_names  # noqa: E402
from experiments.harness.provenance import markdown_header, provenance  # noqa: E402
from timing_model.atomic import write_text_atomic  # noqa: E402

VARIANTS = ("alone", "thread", "process")
CODECS = ("q8", "bf16", "sign", "q4")


class ExchangeJob:
    """One rank's CPU work in a two-rank exchange of ``numel`` gradients with ``codec`` (module doc)."""

    def __init__(self, codec: str, numel: int, wire_s: float) -> None:
        import torch

        from pipesgd.compression import build
        from pipesgd.compression.error_feedback import open_encoder

        self._open = open_encoder
        self.codec, self.wire_s = build(codec), wire_s
        self.flat = torch.randn(numel, generator=torch.Generator().manual_seed(0))
        half = numel // 2
        self.own, self.theirs, self.positions = self.flat[:half], self.flat[half:], (0, half)
        self.source = self.flat.clone()

    def __call__(self) -> float:
        """Runs once; returns the calling thread's CPU seconds in it."""
        start = time.thread_time()
        self.flat.copy_(self.source)  # the next step's gradients
        encoder = self._open(self.codec, self.flat, None, 2, deferred=True)
        outgoing = encoder.encode_chunks([self.theirs], [self.positions[1]])[0]
        time.sleep(self.wire_s / 2)  # the all-to-all on the wire
        self.own.add_(encoder.decode(outgoing, self.own)).div_(2)  # the peer's payload stands in for its own
        payload = encoder.settle_(self.own, self.positions[0])
        encoder.drain()
        time.sleep(self.wire_s / 2)  # the all-gather on the wire
        encoder.decode_into(payload, self.theirs)
        return time.thread_time() - start


def _pin(cores: int) -> None:
    if cores == 1:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def _serve(connection, codec: str, numel: int, wire_s: float, cores: int) -> None:
    """The helper process: one job per byte received, its CPU seconds sent back."""
    import torch

    torch.set_num_threads(1)
    _pin(cores)
    job = ExchangeJob(codec, numel, wire_s)
    while connection.recv_bytes() == b"j":
        connection.send(job())


class ThreadWorker:
    def __init__(self, job: ExchangeJob) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._done: queue.Queue = queue.Queue()
        self._thread = threading.Thread(target=self._loop, args=(job,), daemon=True)
        self._thread.start()

    def _loop(self, job: ExchangeJob) -> None:
        while self._jobs.get():
            self._done.put(job())

    def submit(self) -> None:
        self._jobs.put(True)

    def wait(self) -> float:
        return self._done.get()

    def close(self) -> None:
        self._jobs.put(False)
        self._thread.join()


class ProcessWorker:
    def __init__(self, codec: str, numel: int, wire_s: float, cores: int) -> None:
        context = mp.get_context("spawn")
        self._connection, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child, codec, numel, wire_s, cores), daemon=True)
        self._process.start()

    def submit(self) -> None:
        self._connection.send_bytes(b"j")

    def wait(self) -> float:
        return self._connection.recv()

    def close(self) -> None:
        self._connection.send_bytes(b"q")
        self._process.join(30)


def run_variant(variant: str, args) -> dict:
    """The training loop under one variant: ms per iteration and CPU per iteration of the training thread, and the
    job's CPU per iteration (medians over the measured steps)."""
    import torch

    from pipesgd.train.models import build_model

    torch.manual_seed(0)
    model = build_model("resnet20", (1, 8, 8), 10)
    numel = sum(p.numel() for p in model.parameters())
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.randn(32, 1, 8, 8), torch.randint(0, 10, (32,))
    worker = None
    if variant == "thread":
        worker = ThreadWorker(ExchangeJob(args.compression, numel, args.wire_ms / 1e3))
    elif variant == "process":
        worker = ProcessWorker(args.compression, numel, args.wire_ms / 1e3, args.cores)
    walls, cpus, jobs, pending = [], [], [], False
    try:
        for step in range(args.warmup_steps + args.steps):
            wall, cpu = time.perf_counter(), time.thread_time()
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            if pending:
                jobs.append(worker.wait())  # the previous step's average is due
            opt.step()
            if worker is not None:
                worker.submit()
                pending = True
            if step >= args.warmup_steps:
                walls.append(time.perf_counter() - wall)
                cpus.append(time.thread_time() - cpu)
        if pending:
            jobs.append(worker.wait())
    finally:
        if worker is not None:
            worker.close()
    return {"ms": 1e3 * statistics.median(walls), "cpu_ms": 1e3 * statistics.median(cpus),
            "job_cpu_ms": 1e3 * statistics.median(jobs[args.warmup_steps:]) if jobs else 0.0}


def table(rounds: list[dict[str, dict]]) -> str:
    """Medians over rounds per variant, and each variant's slowdown over ``alone`` (round by round, then the median)."""
    lines = ["| worker | training ms / iteration | training thread CPU ms | job CPU ms | slowdown over alone |",
             "|---|---|---|---|---|"]
    for variant in VARIANTS:
        runs = [r[variant] for r in rounds]
        slowdown = statistics.median(r[variant]["ms"] / r["alone"]["ms"] for r in rounds)
        lines.append(f"| {variant} | {statistics.median(x['ms'] for x in runs):.1f} "
                     f"| {statistics.median(x['cpu_ms'] for x in runs):.1f} "
                     f"| {statistics.median(x['job_cpu_ms'] for x in runs):.1f} | {slowdown:.3f}x |")
    return "\n".join(lines)


def main() -> int:
    parser = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cores", default="1,2", help="comma list of 1 (all pinned to one core) and 2 (unpinned)")
    parser.add_argument("--compression", default="q8", help=f"the job's codec: one of {', '.join(CODECS)}")
    parser.add_argument("--wire-ms", type=float, default=10.0, help="the job's sleep for its bytes on the wire (ms)")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup-steps", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of every variant")
    parser.add_argument("--out", default="experiments/results/bench_worker_kind")
    args = parser.parse_args()
    core_counts = known_names(parser, args.cores, ("1", "2"), "core count")
    known_names(parser, args.compression, CODECS, "codec")
    if args.wire_ms < 0 or args.steps < 3 or args.warmup_steps < 0 or args.repeats < 1:
        parser.error("--wire-ms must be >= 0, --steps >= 3, --warmup-steps >= 0 and --repeats >= 1")
    if "2" in core_counts and len(os.sched_getaffinity(0)) < 2:
        parser.error("--cores 2 needs two cores; this process may use one")
    import torch

    torch.set_num_threads(1)
    sections = []
    scratch = tempfile.mkdtemp(prefix="bench_worker_kind.")
    for cores in map(int, core_counts):
        rounds = []
        for round_ in range(args.repeats):
            runs = {}
            for variant in VARIANTS:
                result = os.path.join(scratch, f"{cores}-{round_}-{variant}.json")
                pid = os.fork()  # each variant in a fresh process, pinned or not, so no run inherits another's state
                if pid == 0:
                    _pin(cores)
                    with open(result, "w") as f:
                        json.dump(run_variant(variant, args), f)
                    os._exit(0)
                _, status = os.waitpid(pid, 0)
                if status != 0 or not os.path.exists(result):
                    print(f"bench_worker_kind: the {variant} run failed (status {status})", file=sys.stderr)
                    return 1
                with open(result) as f:
                    runs[variant] = json.load(f)
                print(f"cores {cores}, round {round_ + 1}, {variant}: {runs[variant]['ms']:.1f} ms / iteration",
                      flush=True)
            rounds.append(runs)
        sections.append(f"### {cores} core{'s' if cores > 1 else ''}, {args.compression}, "
                        f"{args.wire_ms:g} ms on the wire per job, {args.steps} steps, {args.repeats} rounds\n\n"
                        + table(rounds))
        print(sections[-1], flush=True)
    os.makedirs(args.out, exist_ok=True)
    text = markdown_header("The exchange's worker: a thread or a process", provenance()) + "\n\n" + "\n\n".join(
        sections) + "\n"
    write_text_atomic(os.path.join(args.out, "report.md"), text)
    print(f"wrote {os.path.join(args.out, 'report.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
