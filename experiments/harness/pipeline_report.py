"""Issue-11 pipeline benchmark, the report: the records ``experiments.harness.pipeline`` wrote, as two markdown tables
(efficiency = max(compute alone, ring alone) / Pipe-SGD iteration; where an iteration's time and CPU go), and a
third against DDP and DDP with its fp16 hook measured in the same run (speed-up; the comm path's CPU)."""
from __future__ import annotations

import json

__all__ = ["read_records", "markdown"]


def read_records(path: str) -> list[dict]:
    """The JSON lines of one run; a missing file or a bad line raises ValueError naming the file."""
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as error:
        raise ValueError(f"cannot read benchmark records from {path}: {error}") from None


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f}"


def cpu_floor_s(record: dict, cores: int) -> float:
    """The shortest iteration the machine's CPU allows when every rank runs on it: all ranks' process CPU per
    iteration over the cores (what four emulated nodes on two shared cores can at best do)."""
    return record["ranks"] * record["cpu_process"] / cores


def markdown(records: list[dict], title: str, cores: int | None = None) -> str:
    """Both tables for ``records`` (milliseconds per iteration; MB of payload each rank sends per iteration).
    ``cores``: the cores every rank shares (one machine), which adds the CPU floor and the efficiency ceiling."""
    shared = cores is not None
    baselines = [r for r in records if r.get("baseline")]
    records = [r for r in records if not r.get("baseline")]
    head = "| workload | variant | compute alone ms | ring alone ms | pipe iteration ms | efficiency | MB sent |"
    lines = [f"# {title}", "", head + (" CPU floor ms | ceiling |" if shared else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|" if shared else "")]
    for r in records:
        row = (f"| {r['workload']} ({r['params'] / 1e6:.2f} M) | {r['variant']} | {_ms(r['compute_s'])} "
               f"| {_ms(r['ring_s'])} | {_ms(r['t_iter'])} | {r['efficiency']:.2f} | {r['bytes_sent'] / 1e6:.2f} |")
        if shared:
            bound = max(r["compute_s"], r["ring_s"])
            row += f" {_ms(cpu_floor_s(r, cores))} | {bound / max(bound, cpu_floor_s(r, cores)):.2f} |"
        lines.append(row)
    lines += ["", "efficiency = max(compute alone, ring alone) / pipe iteration (1.00: the pipeline costs only its "
              "slower half). Times: the slowest rank's median; below, means over ranks per iteration."]
    if shared:
        lines.append(f"CPU floor = all ranks' process CPU per iteration / {cores} cores (every rank on this machine); "
                     "ceiling = max(compute, ring) / max(that, CPU floor): the best efficiency these cores allow.")
    lines += ["",
              "| workload | variant | compute | pack/unpack | blocked on comm | update | comm busy | wire wait | codec "
              "| error feedback | finite check | comm other | CPU caller | CPU comm |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in records:
        named = r["wire_wait"] + r["codec"] + r["error_feedback"] + r["finite_check"]
        other = max(0.0, r["comm_busy"] - named)
        cpu_comm = max(0.0, r["cpu_process"] - r["cpu_main"])
        cells = [r["compute"], r["pack_unpack"], r["wait"], r["update"], r["comm_busy"], r["wire_wait"], r["codec"],
                 r["error_feedback"], r["finite_check"], other, r["cpu_main"], cpu_comm]
        lines.append(f"| {r['workload']} | {r['variant']} | " + " | ".join(_ms(c) for c in cells) + " |")
    lines += ["", "ms per iteration. compute, pack/unpack, blocked on comm and update run on the caller's thread; "
              "comm busy is the background worker's wall time per step, split into waiting on the wire, codec "
              "(encode + decode), error feedback (residual fold-in, booking, norm), the finite check and the rest "
              "(reduction adds, copies, Python). CPU caller / CPU comm: thread CPU time of the caller, and the rest "
              "of the process (the comm worker and gloo's threads)."]
    if baselines:
        lines += ["", *against_ddp(records, baselines)]
    return "\n".join(lines)


def comm_cpu_s(record: dict) -> float:
    """CPU per iteration beyond compute alone (all of the process: caller, comm worker, gloo's threads): what
    the communication path costs the machine, for Pipe-SGD and DDP alike."""
    return max(0.0, record["cpu_process"] - record["compute_cpu_s"])


def against_ddp(records: list[dict], baselines: list[dict]) -> list[str]:
    """Per workload: each Pipe-SGD variant's speed-up over DDP and DDP+fp16 (iteration times of this run) and its
    comm-path CPU per iteration beside theirs."""
    lines = ["| workload | variant | iteration ms | vs ddp | vs ddp+fp16 | comm-path CPU ms | vs ddp's |",
             "|---|---|---|---|---|---|---|"]
    for workload in dict.fromkeys(r["workload"] for r in records + baselines):
        peers = {b["variant"]: b for b in baselines if b["workload"] == workload}
        ddp = peers.get("ddp")
        for r in [*peers.values(), *(r for r in records if r["workload"] == workload)]:
            speedups = [f"{peers[name]['t_iter'] / r['t_iter']:.2f}x" if name in peers else "-"
                        for name in ("ddp", "ddp+fp16")]
            cpu_ratio = f"{comm_cpu_s(r) / comm_cpu_s(ddp):.2f}" if ddp and comm_cpu_s(ddp) > 0 else "-"
            lines.append(f"| {workload} | {r['variant']} | {_ms(r['t_iter'])} | {' | '.join(speedups)} "
                         f"| {_ms(comm_cpu_s(r))} | {cpu_ratio} |")
    lines += ["", "vs ddp / vs ddp+fp16: their iteration time over this row's, measured in the same run (ddp's "
              "allreduce runs inside backward). comm-path CPU: process CPU per iteration beyond compute alone's, "
              "means over ranks (kernel network work outside the processes is not in it)."]
    return lines
