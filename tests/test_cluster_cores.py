"""Pinning emulated nodes to cores of their own (``pipesgd.cluster.cores``, ``pin``, ``up --cores-per-node``)."""
from __future__ import annotations

import io
import os
import subprocess
import sys

import pytest

from pipesgd.cluster import cli, topology
from pipesgd.cluster.cluster import Cluster
from pipesgd.cluster.cores import format_cores, node_cores, parse_cores, pinned_argv
from pipesgd.cluster.launch import LaunchSpec, cluster_commands
from pipesgd.cluster.netns import cluster_netns
from pipesgd.cluster.state import ClusterState, load_state, save_state

from tests.test_cluster import make_state, root_ok, unique_name  # noqa: F401  (root_ok is a fixture)

PIN = [sys.executable, "-m", "pipesgd.cluster.pin"]


def test_node_cores_are_disjoint_slices_in_node_order():
    assert node_cores(4, 2, list(range(16))) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert node_cores(2, 1, [3, 5, 9]) == [[3], [5]]
    assert node_cores(3, 0, [0, 1]) == [[], [], []]  # 0: not pinned, any core count


@pytest.mark.parametrize("nodes,per_node,available,needle", [
    (4, 1, [0, 1], "needs 4 cores for 4 nodes, this machine allows 2"),
    (2, -1, [0, 1], "must be >= 0"),
])
def test_node_cores_refuses(nodes, per_node, available, needle):
    with pytest.raises(ValueError, match=needle):
        node_cores(nodes, per_node, available)


@pytest.mark.parametrize("cores,text", [([0, 1, 2, 5], "0-2,5"), ([3], "3"), ([0, 2, 3, 4, 7, 8], "0,2-4,7-8"),
                                        ([1, 0], "0-1")])
def test_core_list_format_and_parse(cores, text):
    assert format_cores(cores) == text
    assert parse_cores(text) == sorted(cores)


@pytest.mark.parametrize("text", ["", "a", "3-1", "-1", "1-", "0,,2"])
def test_parse_cores_rejects(text):
    with pytest.raises(ValueError, match="bad core list"):
        parse_cores(text)


def test_commands_of_a_pinned_cluster_run_through_the_pin():
    s = make_state(name="psgd-pin", nodes=2, node_cores=[[0], [1]])
    assert s.pinned and not make_state(nodes=2).pinned
    spec = LaunchSpec(nnodes=2, master_addr=s.master_addr, master_port=29500, ifname=s.ifname, torchrun=False)
    cmds = [argv for argv, _ in cluster_commands(s, spec, ["true"], {})]
    assert cmds == [["ip", "netns", "exec", "psgd-pin-node0", *PIN, "0", "--", "true"],
                    ["ip", "netns", "exec", "psgd-pin-node1", *PIN, "1", "--", "true"]]
    assert pinned_argv([], ["true"]) == ["true"]


def test_state_keeps_cores_and_reads_files_without_them(tmp_path):
    s = make_state(name="psgd-pinrt", nodes=2, node_cores=[[0, 1], [2, 3]])
    save_state(s, str(tmp_path))
    assert load_state("psgd-pinrt", str(tmp_path)).node_cores == [[0, 1], [2, 3]]
    old = ClusterState.from_json(make_state(name="psgd-old", nodes=3).to_json().replace('"node_cores"', '"x"'))
    assert old.node_cores == [[], [], []] and not old.pinned
    with pytest.raises(ValueError, match="node_cores has 1 entries for 2 nodes"):
        make_state(nodes=2, node_cores=[[0]])


@pytest.mark.slow
def test_pin_runs_the_command_on_the_listed_cores_only():
    core = sorted(os.sched_getaffinity(0))[-1]
    out = subprocess.run([*PIN, str(core), "--", sys.executable, "-c",
                          "import os; print(sorted(os.sched_getaffinity(0)))"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"[{core}]"


@pytest.mark.parametrize("args,code,needle", [
    (["0"], 2, "usage"),
    (["x", "--", "true"], 2, "bad core list"),
    (["100000", "--", "true"], 2, "cannot pin"),
    (["0", "--", "/nonexistent/cmd"], 127, "cannot start"),
])
@pytest.mark.slow
def test_pin_refusals_are_one_line(args, code, needle):
    out = subprocess.run([*PIN, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == code
    assert needle in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_cli_up_refuses_more_cores_than_the_machine_has(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPESGD_CLUSTER_STATE_DIR", str(tmp_path))
    too_many = len(os.sched_getaffinity(0)) + 1
    assert cli.main(["up", "--nodes", "1", "--cores-per-node", str(too_many), "--name", "psgd-toomany"]) == 2
    err = capsys.readouterr().err.strip()  # bad input for this machine: refused before anything is built
    assert err.startswith("pipesgd-cluster: error:") and "this machine allows" in err and len(err.splitlines()) == 1


@pytest.mark.root
@pytest.mark.slow
def test_root_pinned_nodes_run_on_their_own_cores(root_ok, tmp_path):  # noqa: F811
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    name = unique_name()
    try:
        cluster = Cluster.up(2, None, name=name, state_dir=str(tmp_path), cores_per_node=1)
        assert cluster.state.node_cores == [[c] for c in sorted(os.sched_getaffinity(0))[:2]]
        assert "cores" in cluster.status()
        out = io.StringIO()
        script = "grep Cpus_allowed_list /proc/self/status | tr -s '\\t ' ' '"
        assert cluster.run(["sh", "-c", script], torchrun=False, timeout_s=30, out=out, err=io.StringIO()) == 0
        lines = set(out.getvalue().splitlines())
        expected = {f"[node {i}] Cpus_allowed_list: {cores[0]}" for i, cores in enumerate(cluster.state.node_cores)}
        assert expected <= lines, lines
    finally:
        topology.teardown(name, str(tmp_path))
        assert cluster_netns(name) == []
