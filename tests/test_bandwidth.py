"""``timing_model.bandwidth``: the one rate rule of every command line (tc and iperf spellings; bps, a lone b and a bare
number refused as ambiguous), and both CLIs reading a rate alike."""
from __future__ import annotations

import pytest

from timing_model.bandwidth import parse_bandwidth_Bps, parse_bandwidth_bps
from pipesgd.cluster.units import parse_link
from timing_model.units import parse_bandwidth


@pytest.mark.parametrize("text,bits_per_s", [
    ("1gbit", 1e9), ("100mbit", 1e8), ("500kbit", 5e5), ("10Gbit", 1e10), ("1tbit", 1e12),  # tc
    ("1Gbit/s", 1e9), ("940 Mbits/sec", 9.4e8), ("117 MBytes/sec", 9.36e8),  # iperf
    ("10Gb/s", 1e10), ("10GbE", 1e10), ("1e2mbit", 1e8),
    ("1.25GB/s", 1e10), ("125MB/s", 1e9), ("125MBps", 1e9), ("12.5MB", 1e8), ("1 GB/s", 8e9),
    ("2MiB/s", 16 * 2**20), ("1Kibit", 1024), ("3 bytes/s", 24),
])
def test_tc_and_iperf_spellings(text, bits_per_s):
    assert parse_bandwidth_bps(text) == pytest.approx(bits_per_s, rel=1e-12)
    assert parse_bandwidth_Bps(text) == pytest.approx(bits_per_s / 8, rel=1e-12)


@pytest.mark.parametrize("text,needle", [
    ("1gbps", "ambiguous: tc reads bps as bytes/s"), ("100Mbps", "ambiguous"), ("10kbps", "ambiguous"),
    ("100mb", "ambiguous"), ("1000", "has no unit: write bits (1000bit) or bytes (1000B/s)"),
    ("1e9", "has no unit"), ("10G", "(10Gbit) or bytes (10GB/s)"),
    ("0mbit", "positive"), ("-1gbit", "positive"), ("1e400gbit", "finite"), ("nan", "not a number"),
    ("inf", "not a number"), ("", "not a number"), ("fast", "not a number"), ("10gbot", "unknown unit 'bot'"),
    ("1gbits/h", "unknown unit"),
])
def test_ambiguous_or_bad_rates_are_refused_with_the_input_named(text, needle):
    with pytest.raises(ValueError, match="bandwidth") as info:
        parse_bandwidth_bps(text)
    assert needle in str(info.value) and repr(text) in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize("text", ["100mbit", "1Gbit/s", "1.25GB/s", "10GbE"])
def test_the_cluster_and_the_timing_model_read_a_rate_alike(text):
    """One parser: the cluster's bits/s are exactly 8 times the model's bytes/s (they were 8x apart for a bare
    number, and one of them took 1gbps)."""
    assert parse_link(text) == 8 * parse_bandwidth(text)
