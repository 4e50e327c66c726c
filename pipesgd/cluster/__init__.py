"""An emulated N-node cluster on one Linux machine: network namespaces on a bridge, tbf-shaped links.

``pipesgd-cluster up/run/status/measure/down`` on the command line; ``Cluster`` from Python.
"""
from .cluster import Cluster
from .launch import LaunchSpec, node_argv, node_env, torchrun_tail
from .measure import Throughput
from .netns import ClusterError
from .state import ClusterState
from .units import UNSHAPED, default_burst_bytes, format_bandwidth, parse_link

__all__ = ["Cluster", "ClusterError", "ClusterState", "LaunchSpec", "Throughput", "UNSHAPED", "default_burst_bytes",
           "format_bandwidth", "node_argv", "node_env", "parse_link", "torchrun_tail"]
