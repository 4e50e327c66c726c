"""Per timed exchange of a bench_pipeline run with the round-timeline probe: how long the all-to-all's rounds (which
overlap the next step's compute) and the all-gather's rounds (after it) take against the link's own time for a
round's payload, and how late round 1 is posted. Usage: python analyze.py EVENTS_DIR [EVENTS_DIR ...]"""
import glob
import statistics as st
import sys

ROUND_BYTES, RATE = 466378, 200e6 / 8 * 1448 / 1514  # q8 chunk of the 1.9 M MLP at p = 4; 200 Mbit/s of TCP payload


def load(folder):
    ranks = {}
    for name in glob.glob(f"{folder}/events-*.txt"):
        exchanges, rounds, computes = [], [], []
        for fields in (line.split() for line in open(name)):
            if fields[0] == "round":
                rounds.append((int(fields[1]), *map(float, fields[3:6])))
            elif fields[0] == "exchange":
                exchanges.append((float(fields[1]), float(fields[2]), rounds))
                rounds = []
            elif fields[0] == "compute":
                computes.append((float(fields[1]), float(fields[2])))
        ranks[int(name.split("events-")[1].split("-")[0])] = (exchanges, computes)
    return ranks


rows = {"a2a": [], "ag": [], "gap": [], "late": [], "exchange": [], "compute_in_a2a": [], "late_alone": []}
for folder in sys.argv[1:]:
    ranks = load(folder)
    alone = [exchanges[:-10] for exchanges, _ in ranks.values()]  # before the pipeline's 2 warm-up and 8 timed ones
    for k in range(min(len(a) for a in alone)):
        rows["late_alone"].append(max(a[k][2][0][1] - a[k][0] for a in alone))
    for k in range(-8, 0):  # the timed iterations (bench_pipeline --steps 8)
        ex = [ranks[r][0][k] for r in ranks]
        a2a_start = min(tp for _, _, rounds in ex for c, tp, _, _ in rounds if c == 0)
        a2a_end = max(td for _, _, rounds in ex for c, _, _, td in rounds if c == 0)
        ag_start = min(tp for _, _, rounds in ex for c, tp, _, _ in rounds if c == 1)
        ag_end = max(td for _, _, rounds in ex for c, _, _, td in rounds if c == 1)
        rows["a2a"].append(a2a_end - a2a_start)
        rows["ag"].append(ag_end - ag_start)
        rows["gap"].append(ag_start - a2a_end)
        rows["late"].append(max(rounds[0][1] - start for start, _, rounds in ex))
        rows["exchange"].append(max(end for _, end, _ in ex) - min(start for start, _, _ in ex))
        busy = [min(y, a2a_end) - max(x, a2a_start) for r in ranks for x, y in ranks[r][1] if x < a2a_end and y > a2a_start]
        rows["compute_in_a2a"].append(sum(busy))
ideal = 3 * ROUND_BYTES / RATE
print(f"{len(rows['a2a'])} exchanges; 3 rounds on the link alone: {ideal * 1e3:.1f} ms")
for key, what in (("a2a", "all-to-all, 3 rounds (first post to last done, over ranks)"),
                  ("ag", "all-gather, 3 rounds"), ("gap", "first all-gather post less last all-to-all end (sum and encode; negative where ranks overlap)"),
                  ("late", "round 1 posted after the exchange began (latest rank)"),
                  ("late_alone", "the same in the all-reduce alone (its exchanges before the pipeline's)"),
                  ("exchange", "whole exchange (first start to last end)"),
                  ("compute_in_a2a", "training threads' compute inside the all-to-all (4 ranks summed)")):
    v = [x * 1e3 for x in rows[key]]
    print(f"{what}: median {st.median(v):.1f} ms, mean {st.mean(v):.1f}, range {min(v):.1f}-{max(v):.1f}")
