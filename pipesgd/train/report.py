"""The lines a run ends with: the one final result (evaluated after ``flush()`` applied the last update), the speed,
where an iteration's time went, and for Pipe-SGD in words how much of the all-reduce hid behind the step's own work
and, where little did, why not on this machine. Every figure comes from the run's summary (``metrics.summarize``).
"""
from __future__ import annotations

from .config import TrainConfig
from .metrics import pipe_staleness

# Above this share of the exchange hidden, the words say "nearly all" and look for no reason: a word threshold, not
# a measurement (the hand-off and the final wait of each step always show a little).
NEARLY_ALL = 0.9


def format_summary(cfg: TrainConfig, s: dict) -> str:
    """The summary as the lines printed at the end of a run."""
    def part(name, seconds):
        share = 100 * seconds / s["t_iter"] if s["t_iter"] > 0 else 0.0
        return f"{name} {1000 * seconds:.2f} ms ({share:.0f} %)"

    width = _width(cfg, s)
    shown_width = f"auto: {width}" if cfg.width == "auto" and s.get("auto_choice") else width
    mode = f"{cfg.mode} (width {shown_width}{pipe_staleness(cfg)})" if cfg.mode == "pipe" else cfg.mode
    comm = "waiting for communication" if cfg.mode != "ddp" else "waiting for communication (inside compute for ddp)"
    ranks = f"{s['world_size']} ranks"
    if s["num_workers"] != s["world_size"]:
        servers = s["world_size"] - s["num_workers"]
        ranks += f" ({servers} server{'s' if servers > 1 else ''}, {s['num_workers']} workers)"
    lines = [
        f"done: {cfg.model} on {cfg.dataset_name}, mode {mode}, {ranks}, {s['steps']} steps, "
        f"{_count(s['epochs'], 'epoch')}; after the last update: test accuracy {100 * s['accuracy']:.1f} % "
        f"(loss {s['test_loss']:.4f})",
        f"speed: {s['iters_per_s']:.1f} iterations/s, {1000 * s['t_iter']:.2f} ms per iteration "
        f"(mean of the last {s['measured_steps']} of this run)",
        "time per iteration: " + ", ".join([part("compute", s["t_compute"]), part(comm, s["t_wait"]),
                                            part("optimizer", s["t_update"]), part("other", s["t_other"])]),
    ]
    if cfg.mode == "pipe":
        lines += overlap_lines(s, width)
    return "\n".join(lines)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _width(cfg: TrainConfig, s: dict) -> int | str:
    """The width the run ended at: the configured one, or what --width auto chose last."""
    if cfg.width == "auto" and s.get("auto_choice"):
        return s["auto_choice"]["width"]
    return cfg.effective_width


def overlap_lines(s: dict, width: int | str) -> list[str]:
    """What Pipe-SGD did in this run, in words: the all-reduce's time per step (``t_comm_busy``), the part the step
    waited for (``t_wait``), the rest hidden; and, when little hid, the reason this machine shows."""
    exchange_s, wait_s = s.get("t_comm_busy", 0.0), s["t_wait"]
    if s["num_workers"] < 2 or exchange_s <= 0:
        return []  # one worker: nothing to all-reduce
    if width == 1:
        return ["Pipe-SGD at width 1 is synchronous: each step waited for its own all-reduce, nothing overlapped."]
    hidden_s = min(max(exchange_s - wait_s, 0.0), exchange_s)
    share = hidden_s / exchange_s
    ms = lambda seconds: f"{1000 * seconds:.2f} ms"  # noqa: E731
    lines = [f"Pipe-SGD: each step's all-reduce ran in the background while the next step computed; "
             f"{ms(hidden_s)} of its {ms(exchange_s)} per step ({100 * share:.0f} %) hid behind that work, "
             f"and the step waited {ms(wait_s)} for the rest."]
    if share >= NEARLY_ALL:
        return lines
    rest_s = max(s["t_iter"] - wait_s, 0.0)  # the step's own work, which the exchange can hide behind at most
    cores, local_ranks = s.get("cpu_cores"), s.get("local_ranks")
    if cores and local_ranks and local_ranks > cores:
        lines.append(f"Why not all of it: {local_ranks} ranks share {cores} CPU core{'s' if cores > 1 else ''} on "
                     "this machine, so the background all-reduce and the next step's compute take turns on the "
                     "same cores instead of running side by side; with a core (or a GPU) per rank more of it hides.")
    elif exchange_s > rest_s:
        lines.append(f"Why not all of it: the all-reduce takes longer than the rest of a step ({ms(exchange_s)} "
                     f"against {ms(rest_s)}), and at most that much can hide behind it; a codec (--compression) or "
                     "a faster link shortens the all-reduce.")
    else:
        lines.append("Why not all of it: each rank had a core of its own and the all-reduce was shorter than the "
                     "rest of a step; --trace FILE shows where in the step the wait falls.")
    return lines
