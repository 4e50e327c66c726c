"""Tests for pipesgd.cluster (the emulated N-node cluster).

Pure tests (parsing, naming, command construction, state files, the process supervisor, CLI refusals)
always run. Tests marked ``root`` build real namespaces and skip with the reason unless this is root,
``ip``/``tc`` exist and ``ip netns add`` works. Every cluster gets a unique name and is torn down in a
``finally``, so parallel runs do not collide and a failing test leaves nothing behind.
"""
from __future__ import annotations

import io
import json
import os
import runpy
import shutil
import subprocess
import sys
import time
import uuid

import pytest

from pipesgd.cluster import cli, topology
from pipesgd.cluster.cluster import Cluster
from pipesgd.cluster.launch import LaunchSpec, cluster_commands, node_argv, node_env, torchrun_tail
from pipesgd.cluster.netns import ClusterError, cluster_netns, netns_pids, preflight
from pipesgd.cluster.state import (ClusterState, load_state, node_netns, port_ifname, remove_state,
                                   save_state, state_path, switch_netns, validate_name)
from pipesgd.cluster.supervise import TIMEOUT_EXIT, exit_code, supervise
from timing_model.bandwidth import parse_bandwidth_bps
from pipesgd.cluster.units import default_burst_bytes, parse_size

HERE = os.path.dirname(os.path.abspath(__file__))
ALLREDUCE_SCRIPT = os.path.join(HERE, "cluster_allreduce_script.py")


def unique_name() -> str:
    return f"psgd-t{os.getpid() % 100000}{uuid.uuid4().hex[:4]}"


def make_state(name="psgd-x", nodes=2, **kw) -> ClusterState:
    args = dict(bandwidth_bps=1e8, burst_bytes=65536, queue_ms=50.0, mtu=1500, shape_ingress=True)
    args.update(kw)
    return ClusterState(name=name, nodes=nodes, **args)


# ---------------------------------------------------------------------------------------------
# Units
def test_parse_size():
    assert parse_size("65536") == 65536
    assert parse_size("64kb") == parse_size("64k") == 65536
    assert parse_size("1mb") == 2**20
    for bad in ("", "lots", "0", "1tb"):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_default_burst():
    # Floors: one GSO packet (64 KiB), one 250 Hz tick of traffic, 4 MTU frames.
    assert default_burst_bytes(1e8) == 65536
    assert default_burst_bytes(1e9) == 500_000
    assert default_burst_bytes(1e10) == 5_000_000
    assert default_burst_bytes(1e6, mtu=65000) >= 4 * 65000
    for bps in (5e5, 1e8, 1e9, 4e10):
        assert default_burst_bytes(bps) >= bps / 8 / 250


# ---------------------------------------------------------------------------------------------
# Naming and state
def test_names_are_prefixed_and_fit_ifnamsiz():
    assert validate_name("psgd") == "psgd"
    assert node_netns("psgd", 3) == "psgd-node3"
    assert switch_netns("psgd-exp") == "psgd-exp-sw"
    assert len(port_ifname(239)) <= 15
    s = make_state(nodes=3)
    assert all(ns.startswith("psgd-") for ns in [*s.node_netns, s.switch_netns])
    assert s.addresses == ["10.77.0.10", "10.77.0.11", "10.77.0.12"]
    assert s.master_addr == "10.77.0.10"
    for bad in ("cluster", "psgd x", "psgd/..", "psgd-", "psgd;rm", "p" * 50):
        with pytest.raises(ValueError):
            validate_name(bad)


def test_state_validation():
    with pytest.raises(ValueError):
        make_state(nodes=0)
    with pytest.raises(ValueError):
        make_state(nodes=241)
    for bad in ({"bandwidth_bps": 0}, {"queue_ms": float("nan")}, {"bandwidth_bps": float("inf")}):
        with pytest.raises(ValueError, match="positive and finite"):
            make_state(**bad)
    with pytest.raises(ValueError):
        make_state(mtu=100)


def test_state_file_round_trip(tmp_path):
    s = make_state(name="psgd-rt", nodes=4, created_at=12.5)
    path = save_state(s, str(tmp_path))
    assert path == state_path("psgd-rt", str(tmp_path))
    assert os.listdir(tmp_path) == ["psgd-rt.json"]  # no temp file left behind
    assert json.loads(open(path).read())["addresses"][3] == "10.77.0.13"
    assert load_state("psgd-rt", str(tmp_path)) == s
    save_state(s, str(tmp_path))  # overwrite is fine (atomic rename)
    remove_state("psgd-rt", str(tmp_path))
    remove_state("psgd-rt", str(tmp_path))  # twice is fine
    assert load_state("psgd-rt", str(tmp_path)) is None


# ---------------------------------------------------------------------------------------------
# Command construction
@pytest.mark.parametrize("argv,tail", [
    (["pipesgd-train", "--mode", "pipe"], ["-m", "pipesgd.train", "--mode", "pipe"]),
    (["/usr/bin/pipesgd-train"], ["-m", "pipesgd.train"]),
    (["python", "-m", "pipesgd.train", "--width", "2"], ["-m", "pipesgd.train", "--width", "2"]),
    (["python3", "-m", "mypkg.main", "-x"], ["-m", "mypkg.main", "-x"]),
    ([sys.executable, "script.py", "--a"], ["script.py", "--a"]),
    (["tests/foo.py", "1"], ["tests/foo.py", "1"]),
    (["hostname"], ["--no-python", "hostname"]),
])
def test_torchrun_tail(argv, tail):
    assert torchrun_tail(argv) == tail


@pytest.mark.parametrize("argv", [[], ["torchrun", "x.py"], ["python", "-c", "print(1)"], ["python"]])
def test_torchrun_tail_rejects(argv):
    with pytest.raises(ValueError):
        torchrun_tail(argv)


def test_node_argv_and_env():
    spec = LaunchSpec(nnodes=4, master_addr="10.77.0.10", master_port=29511, ifname="psgd-veth",
                      nproc_per_node=2)
    argv = node_argv(spec, 3, ["pipesgd-train", "--mode", "pipe"])
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"]
    opts = dict(zip(argv[3:-2:2], argv[4:-2:2]))
    assert opts == {"--nnodes": "4", "--node-rank": "3", "--nproc-per-node": "2", "--master-addr": "10.77.0.10",
                    "--master-port": "29511", "--max-restarts": "0", "-m": "pipesgd.train"}
    assert argv[-2:] == ["--mode", "pipe"]
    env = node_env(spec, 3, {"PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert env["GLOO_SOCKET_IFNAME"] == env["NCCL_SOCKET_IFNAME"] == env["TP_SOCKET_IFNAME"] == "psgd-veth"
    assert (env["NODE_RANK"], env["NNODES"], env["MASTER_ADDR"], env["MASTER_PORT"]) == \
        ("3", "4", "10.77.0.10", "29511")
    with pytest.raises(ValueError):
        node_argv(spec, 4, ["x"])
    raw = LaunchSpec(nnodes=2, master_addr="10.77.0.10", master_port=1, ifname="psgd-veth", torchrun=False)
    assert node_argv(raw, 1, ["sh", "-c", "true"]) == ["sh", "-c", "true"]


def test_cluster_commands_wrap_in_node_namespace():
    s = make_state(name="psgd-cc", nodes=2)
    spec = LaunchSpec(nnodes=2, master_addr=s.master_addr, master_port=29500, ifname=s.ifname, torchrun=False)
    cmds = cluster_commands(s, spec, ["true"], {})
    assert [c[0] for c in cmds] == [["ip", "netns", "exec", "psgd-cc-node0", "true"],
                                    ["ip", "netns", "exec", "psgd-cc-node1", "true"]]
    assert [c[1]["NODE_RANK"] for c in cmds] == ["0", "1"]
    with pytest.raises(ValueError):
        cluster_commands(make_state(nodes=3), spec, ["true"], {})


# ---------------------------------------------------------------------------------------------
# Supervisor (plain processes, no namespaces needed)
def _py(code: str) -> tuple[list[str], dict[str, str]]:
    return [sys.executable, "-c", code], dict(os.environ)


def test_supervise_streams_prefixed_output_and_returns_worst_code():
    out = io.StringIO()
    rc = supervise([_py("print('a')"), _py("import time; time.sleep(0.2); print('b'); raise SystemExit(3)"),
                    _py("print('c')")], out=out, err=io.StringIO(), timeout_s=30)
    assert rc == 3
    lines = out.getvalue().splitlines()
    assert {"[node 0] a", "[node 1] b", "[node 2] c"} <= set(lines)
    assert supervise([_py("pass"), _py("pass")], out=io.StringIO(), timeout_s=30) == 0
    assert exit_code(-15) == 143


def test_supervise_failure_stops_the_others():
    err = io.StringIO()
    t0 = time.monotonic()
    rc = supervise([_py("import time; time.sleep(60)"), _py("raise SystemExit(5)")],
                   out=io.StringIO(), err=err, timeout_s=60, grace_s=2)
    assert rc == 5 and time.monotonic() - t0 < 15
    assert "node 1 exited with code 5" in err.getvalue()


@pytest.mark.slow
def test_supervise_timeout_kills_everything_including_grandchildren(tmp_path):
    pidfile = tmp_path / "grandchild.pid"
    # The child starts a grandchild in a session of its own (as torchrun does with its workers).
    code = ("import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)'], start_new_session=True); open({str(pidfile)!r}, 'w').write(str(p.pid)); "
            "time.sleep(60)")
    err = io.StringIO()
    rc = supervise([_py(code)], out=io.StringIO(), err=err, timeout_s=3, grace_s=2)
    assert rc == TIMEOUT_EXIT and "timeout after 3 s" in err.getvalue()
    grandchild = int(pidfile.read_text())
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _alive(grandchild):
        time.sleep(0.05)
    assert not _alive(grandchild)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


# ---------------------------------------------------------------------------------------------
# CLI refusals that need no root (bad input, exit 2: tests/test_cli_conventions.py)
def test_cli_refuses_non_root(capsys, monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        preflight()
    assert cli.main(["up", "--nodes", "2", "--name", unique_name()]) == 1
    assert "needs root" in capsys.readouterr().err


def test_cli_refuses_missing_tools(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(shutil, "which", lambda tool: None if tool == "tc" else "/usr/sbin/" + tool)
    with pytest.raises(ClusterError, match="`tc` not found"):
        preflight()


def test_module_entry_point_help(capsys, monkeypatch):
    # `python -m pipesgd.cluster` runs __main__ (in-process here: a subprocess would re-import torch).
    monkeypatch.setattr(sys, "argv", ["pipesgd-cluster", "--help"])
    with pytest.raises(SystemExit) as exc:
        runpy.run_module("pipesgd.cluster", run_name="__main__")
    assert exc.value.code == 0 and "measure" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# Root tests: real namespaces
def _root_skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not installed"
    probe = f"psgd-probe{uuid.uuid4().hex[:6]}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "delete", probe], capture_output=True)
    if made.returncode != 0:
        return f"`ip netns add` does not work here: {made.stderr.strip()}"
    return None


@pytest.fixture(scope="module")
def root_ok():
    reason = _root_skip_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture
def cluster2(root_ok, tmp_path):
    name = unique_name()
    try:
        yield Cluster.up(2, parse_bandwidth_bps("100mbit"), name=name, state_dir=str(tmp_path))
    finally:
        topology.teardown(name, str(tmp_path))
        assert cluster_netns(name) == []


@pytest.mark.root
def test_root_up_state_status_and_refuse_twice(cluster2, tmp_path):
    s = cluster2.state
    assert sorted(cluster_netns(s.name)) == sorted([*s.node_netns, s.switch_netns])
    assert load_state(s.name, str(tmp_path)) == s
    status = cluster2.status()
    assert "tbf" in status and "10.77.0.11" in status and "MISSING" not in status
    with pytest.raises(ClusterError, match="already exists"):
        Cluster.up(2, 1e8, name=s.name, state_dir=str(tmp_path))


@pytest.mark.root
@pytest.mark.slow
def test_root_measured_throughput_matches_rate(cluster2):
    result = cluster2.measure(0, 1, duration_s=1.5)
    print(result.summary())
    assert 0.80 <= result.ratio <= 1.05, result.summary()


@pytest.mark.root
@pytest.mark.slow
def test_root_reshape_changes_every_link_of_a_live_cluster(cluster2, tmp_path):
    """The rate a running job sees drops (issue 39's link that changes mid-run): both directions, state saved."""
    cluster2.reshape(parse_bandwidth_bps("20mbit"))
    s = cluster2.state
    assert s.bandwidth_bps == 20e6 and load_state(s.name, str(tmp_path)) == s
    for ns, dev in [(ns, s.ifname) for ns in s.node_netns] + [(s.switch_netns, port_ifname(i)) for i in range(2)]:
        shown = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", dev], capture_output=True, text=True).stdout
        assert "rate 20Mbit" in shown, shown
    result = cluster2.measure(0, 1, duration_s=1.5)
    assert 0.80 <= result.ratio <= 1.05 and result.requested_bps == 20e6, result.summary()


@pytest.mark.root
def test_root_run_no_torchrun(cluster2):
    out = io.StringIO()
    # Each node sees its own address on the shaped veth and its rendezvous variables.
    check = ('ip -4 addr show dev "$GLOO_SOCKET_IFNAME" | grep -q "10.77.0.1$NODE_RANK/" && '
             'test "$NNODES" = 2 && test "$MASTER_ADDR" = 10.77.0.10 && echo ok "$NODE_RANK"')
    assert cluster2.run(["sh", "-c", check], torchrun=False, timeout_s=30, out=out, err=io.StringIO()) == 0
    assert {"[node 0] ok 0", "[node 1] ok 1"} <= set(out.getvalue().splitlines())
    # The worst exit code comes back (node 0 succeeds, node 1 fails with 7).
    assert cluster2.run(["sh", "-c", 'exit $((NODE_RANK * 7))'], torchrun=False, timeout_s=30,
                        out=io.StringIO(), err=io.StringIO()) == 7


@pytest.mark.root
def test_root_failing_node_stops_the_others(cluster2):
    t0 = time.monotonic()
    rc = cluster2.run(["sh", "-c", 'if [ "$NODE_RANK" = 1 ]; then exit 3; fi; sleep 60'], torchrun=False,
                      timeout_s=60, out=io.StringIO(), err=io.StringIO())
    assert rc == 3 and time.monotonic() - t0 < 15
    assert all(netns_pids(ns) == [] for ns in cluster2.state.node_netns)


@pytest.mark.root
@pytest.mark.slow
def test_root_torchrun_gloo_allreduce_through_shaper(cluster2):
    before = [cluster2.sent_bytes(i) for i in range(2)]
    out = io.StringIO()
    rc = cluster2.run([sys.executable, ALLREDUCE_SCRIPT], timeout_s=120, out=out, err=io.StringIO())
    text = out.getvalue()
    assert rc == 0, text[-3000:]
    for node in range(2):
        assert f"[node {node}] ALLREDUCE_OK rank={node} world=2 sum=3 ifname=psgd-veth" in text
    # 1 MiB all-reduced between 2 nodes: each sends about 1 MiB, and it went through its tbf.
    sent = [cluster2.sent_bytes(i) - before[i] for i in range(2)]
    assert all(n >= 2**20 for n in sent), sent


@pytest.mark.root
def test_root_down_removes_everything_and_is_idempotent(root_ok, tmp_path, monkeypatch):
    name = unique_name()
    monkeypatch.setenv("PIPESGD_CLUSTER_STATE_DIR", str(tmp_path))
    try:
        assert cli.main(["up", "--nodes", "2", "--bandwidth", "100mbit", "--name", name]) == 0
        assert len(cluster_netns(name)) == 3
        assert cli.main(["down", "--name", name]) == 0
        assert cli.main(["down", "--name", name]) == 0
        assert cluster_netns(name) == []
        assert load_state(name, str(tmp_path)) is None
        assert not any(d.startswith(name + "-") for d in os.listdir("/etc/netns")) \
            if os.path.isdir("/etc/netns") else True
    finally:
        topology.teardown(name, str(tmp_path))


@pytest.mark.root
def test_root_up_rolls_back_on_failure(root_ok, tmp_path, monkeypatch):
    name = unique_name()
    calls = []

    def flaky_shape(ns, dev, state):
        calls.append(ns)
        if len(calls) == 3:  # fail half-way: node 0 shaped both ways, node 1 not yet
            raise ClusterError("injected failure")

    monkeypatch.setattr(topology, "_shape", flaky_shape)
    try:
        with pytest.raises(ClusterError, match="injected"):
            Cluster.up(2, 1e8, name=name, state_dir=str(tmp_path))
        assert cluster_netns(name) == []
        assert load_state(name, str(tmp_path)) is None
    finally:
        topology.teardown(name, str(tmp_path))


@pytest.mark.root
def test_root_context_manager_cleans_up(root_ok, tmp_path):
    name = unique_name()
    try:
        with pytest.raises(RuntimeError):
            with Cluster.up(1, 1e8, name=name, state_dir=str(tmp_path)) as c:
                assert len(cluster_netns(c.state.name)) == 2
                raise RuntimeError("boom")
        assert cluster_netns(name) == []
    finally:
        topology.teardown(name, str(tmp_path))


# ---------------------------------------------------------------------------------------------
# Unshaped clusters: the same namespaces and bridge without tbf
def test_parse_link_unshaped_or_rate():
    from pipesgd.cluster.units import parse_link

    assert parse_link("unshaped") is None and parse_link(" Unshaped ") is None
    assert parse_link("100mbit") == pytest.approx(1e8)
    with pytest.raises(ValueError):
        parse_link("fast")


def test_unshaped_state_round_trip_and_describe_text(tmp_path):
    s = make_state(name="psgd-un", nodes=2, bandwidth_bps=None, burst_bytes=0)
    assert not s.shaped and make_state().shaped
    assert load_state("psgd-un", str(tmp_path)) is None
    save_state(s, str(tmp_path))
    assert load_state("psgd-un", str(tmp_path)) == s
    with pytest.raises(ValueError):  # a shaped cluster still needs a burst
        make_state(burst_bytes=0)


def test_unshaped_throughput_summary_has_no_ratio():
    from pipesgd.cluster.measure import Throughput

    t = Throughput(0, 1, 10_000_000, 8_000_000, 0.01, None)
    assert t.ratio is None and t.measured_bps == pytest.approx(6.4e9)
    assert "unshaped" in t.summary()
    assert Throughput(0, 1, 1, 1_000_000, 0.1, 1e8).ratio == pytest.approx(0.8)


@pytest.mark.root
def test_root_unshaped_cluster_has_no_tbf_and_carries_traffic(root_ok, tmp_path):
    name = unique_name()
    try:
        c = Cluster.up(2, None, name=name, state_dir=str(tmp_path))
        assert not c.state.shaped and load_state(name, str(tmp_path)) == c.state
        status = c.status()
        assert "tbf" not in status and "unshaped" in status and "MISSING" not in status
        for ns in c.state.node_netns:
            qdisc = subprocess.run(["tc", "-n", ns, "qdisc", "show", "dev", c.state.ifname],
                                   capture_output=True, text=True, check=True).stdout
            assert "tbf" not in qdisc
        result = c.measure(0, 1, duration_s=0.5)
        assert result.ratio is None and result.steady_bytes > 0 and result.measured_bps > 0
    finally:
        topology.teardown(name, str(tmp_path))
        assert cluster_netns(name) == []
