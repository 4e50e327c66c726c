"""``pipesgd-cluster``: up / run / status / measure / down for the emulated cluster (root only).

    ``pipesgd-cluster up --nodes 4 --bandwidth 1gbit``
    ``pipesgd-cluster run --timeout 900 -- pipesgd-train --mode pipe``
    ``pipesgd-cluster down``
Bad input is one line ``pipesgd-cluster: error: ...`` and exit code 2, before anything is built or run; a failure
(no root, a tool that fails, a node that fails) is one line of the same form and exit code 1 (``run`` returns the
nodes' worst exit code, 124 on its timeout).
"""
from __future__ import annotations

import argparse
import signal
import sys

from timing_model.cli_conventions import (EXIT_FAILURE, EXIT_USAGE, OneLineParser, UsageError, join_negative_values,
                                     non_negative_int, positive_float, positive_int, print_error)

from . import launch
from .cluster import DEFAULT_QUEUE_MS, Cluster
from .cores import available_cores, node_cores
from .netns import ClusterError
from .state import DEFAULT_NAME, MAX_NODES, validate_name
from .topology import teardown
from .units import format_bandwidth, parse_link, parse_size

PROG = "pipesgd-cluster"

NO_LATENCY = "netem is not available on this kernel; latency emulation unsupported"


class _Terminated(BaseException):
    """SIGTERM, turned into an exception so cleanup (rollback, stopping nodes) runs."""


def _on_sigterm(signum, frame):
    raise _Terminated()


def _typed(parse, what: str):
    """An argparse type from a parser raising ValueError (argparse names the flag in front of the message)."""
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = what
    return convert


def _in_range(low: int, high: int):
    def convert(text: str) -> int:
        value = positive_int(text) if low >= 1 else non_negative_int(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be in {low}..{high} (got {text!r})")
        return value
    return convert


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog=PROG, description=__doc__.split("\n")[0],
                      epilog="Everything after `--` in `run` is the command to start on each node.")
    sub = p.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="create the namespaces, bridge and tbf shaping")
    up.add_argument("--nodes", type=_in_range(1, MAX_NODES), default=4, help="number of nodes (network namespaces)")
    up.add_argument("--bandwidth", type=_typed(parse_link, "bandwidth"), default="1gbit",
                    help="per-link rate as tc and iperf write it: 1gbit, 100mbit, 1Gbit/s, 125MB/s (a bare number, "
                    "bps and a lone b are refused as ambiguous), or unshaped (no tbf) (default 1gbit)")
    up.add_argument("--burst", type=_typed(parse_size, "size"), default=None,
                    help="tbf bucket in bytes (65536, 64kb); default max(rate/250 Hz, 4 frames, 64 KiB)")
    up.add_argument("--mtu", type=_in_range(576, 65535), default=1500)
    up.add_argument("--queue-ms", type=positive_float, default=DEFAULT_QUEUE_MS,
                    help="tbf latency: longest a packet may queue in the shaper (default %(default)g ms)")
    up.add_argument("--egress-only", action="store_true",
                    help="shape only what nodes send (default: also what they receive, like a full-duplex NIC)")
    up.add_argument("--latency", "--delay", dest="latency", default=None, help=argparse.SUPPRESS)
    up.add_argument("--force", action="store_true", help="tear down an existing cluster of that name first")
    up.add_argument("--cores-per-node", type=non_negative_int, default=0,
                    help="pin each node's commands to this many cores of its own (default 0: all nodes share "
                    "all cores); refused when the machine has fewer than nodes x K")

    run = sub.add_parser("run", help="run a command on every node (torchrun per node by default)",
                         description=launch.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("--nproc-per-node", type=positive_int, default=1)
    run.add_argument("--timeout", type=positive_float, default=None,
                     help="seconds; then every node is killed (exit 124)")
    run.add_argument("--no-torchrun", action="store_true",
                     help="run the command as is, once per node, with NODE_RANK/NNODES/MASTER_ADDR/MASTER_PORT")
    run.add_argument("--max-restarts", type=non_negative_int, default=0, help="passed to torchrun")

    sub.add_parser("status", help="nodes, addresses and tbf counters")
    meas = sub.add_parser("measure", help="one-way TCP throughput between two nodes vs the requested rate")
    meas.add_argument("--src", type=non_negative_int, default=0)
    meas.add_argument("--dst", type=non_negative_int, default=1)
    meas.add_argument("--duration", type=positive_float, default=2.0, help="seconds of sending (default 2)")
    sub.add_parser("down", help="remove namespaces, veths, bridge and state (safe to repeat)")

    for sp in sub.choices.values():
        sp.add_argument("--name", type=_typed(validate_name, "name"), default=DEFAULT_NAME,
                        help="cluster name, prefix of every namespace (psgd…)")
    return p


def check_args(args: argparse.Namespace, command: list[str]) -> None:
    """What argparse's types cannot see alone; raise ``UsageError`` before anything is built or run."""
    if command and args.command != "run":
        raise UsageError("`--` and a command only make sense with `run`")
    if args.command == "run" and not command:
        raise UsageError("no command: use `pipesgd-cluster run [options] -- COMMAND ...`")
    if args.command == "up":
        if args.latency is not None:
            raise UsageError(NO_LATENCY)
        try:
            node_cores(args.nodes, args.cores_per_node, available_cores())
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.command == "measure" and args.src == args.dst:
        raise UsageError(f"measure needs two different nodes (--src and --dst are both {args.src})")


def _split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _main(args: argparse.Namespace, command: list[str]) -> int:
    if args.command == "up":
        c = Cluster.up(args.nodes, args.bandwidth, name=args.name, burst_bytes=args.burst, mtu=args.mtu,
                       queue_ms=args.queue_ms, shape_ingress=not args.egress_only, force=args.force,
                       cores_per_node=args.cores_per_node)
        s = c.state
        links = (f"{format_bandwidth(s.bandwidth_bps)} per link, burst {s.burst_bytes} B" if s.shaped
                 else "unshaped links")
        cores = f", {args.cores_per_node} core(s) per node" if s.pinned else ""
        print(f"cluster {s.name} up: {s.nodes} node(s) {s.addresses[0]}..{s.addresses[-1]}, {links}{cores}")
        return 0
    if args.command == "down":
        removed = teardown(args.name)
        print(f"cluster {args.name}: removed {len(removed)} namespace(s)" if removed
              else f"cluster {args.name}: nothing to remove")
        return 0
    cluster = Cluster.load(args.name)
    if args.command == "status":
        print(cluster.status())
        return 0
    if args.command == "measure":
        missing = [node for node in (args.src, args.dst) if node >= cluster.state.nodes]
        if missing:
            raise UsageError(f"node {missing[0]} does not exist in cluster {args.name} ({cluster.state.nodes} nodes)")
        print(cluster.measure(args.src, args.dst, args.duration).summary())
        return 0
    return cluster.run(command, nproc_per_node=args.nproc_per_node, torchrun=not args.no_torchrun,
                       max_restarts=args.max_restarts, timeout_s=args.timeout)


def main(argv: list[str] | None = None) -> int:
    own, command = _split_command(list(sys.argv[1:] if argv is None else argv))
    try:
        args = build_parser().parse_args(join_negative_values(own))
        check_args(args, command)
    except UsageError as e:
        print_error(PROG, e)
        return EXIT_USAGE
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        return _main(args, command)
    except UsageError as e:  # found once the cluster's state is read (a node it does not have)
        print_error(PROG, e)
        return EXIT_USAGE
    except ClusterError as e:
        print_error(PROG, e)
        return EXIT_FAILURE
    except KeyboardInterrupt:
        print_error(PROG, "interrupted")
        return 130
    except _Terminated:
        print_error(PROG, "terminated")
        return 143
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
