"""docs/simulate.md's table: per case, MMK's mean against the best of Default, MISO and MIGER
at each rate (JCT and makespan against the lowest, STP against the highest), and SLO misses
(MMK's, and the lowest of the three's). python3 best.py [CASE...]"""
import sys

from summarize import ALL_CASES, runs

LABEL = {"h100": "8 H100-80GB", "h200": "8 H200-141GB", "a100-40gb": "8 A100-40GB",
         "a30": "8 A30-24GB", "online10": "10 % online, 8 A100-80GB", "online50": "50 % online",
         "online90": "90 % online", "gpus32": "32 A100-80GB, 4,800 jobs",
         "gpus128": "128 A100-80GB, 10,000 jobs (seed 1)"}


def miss(v):
    if v < 0.005:
        return "0"
    return f"{v:.2f}" if v < 1 else f"{v:.1f}" if v < 10 else f"{v:.0f}"


def pct(v, loss):
    s = f"{v:+.1f}" if abs(v) >= 0.05 else "0"
    s = s.replace("-", "\u2212")
    return f"**{s}**" if loss else s


for case, d, m in runs(sys.argv[1:] or ALL_CASES):
    ivs = sorted({i for (i, p) in m if p == "mmk"})
    cols = {"jct": [], "mk": [], "stp": [], "slo": [], "bslo": []}
    for i in ivs:
        mm = m[(i, "mmk")]
        base = [m[(i, b)] for b in ("default", "miso", "miger") if (i, b) in m]
        j = (mm["avg_jct_s"] / min(b["avg_jct_s"] for b in base) - 1) * 100
        k = (mm["makespan_s"] / min(b["makespan_s"] for b in base) - 1) * 100
        t = (mm["stp"] / max(b["stp"] for b in base) - 1) * 100
        cols["jct"].append(pct(j, j > 0.5))
        cols["mk"].append(pct(k, k > 0.5))
        cols["stp"].append(pct(t, t < -0.5))
        cols["slo"].append(miss(mm["slo_miss_pct"]))
        cols["bslo"].append(miss(min(b["slo_miss_pct"] for b in base)))
    rates = f"{ivs[0]:g}-{ivs[-1]:g} s"
    print(f"| {LABEL[case]} | {rates} | {' / '.join(cols['jct'])} % | {' / '.join(cols['mk'])} % | "
          f"{' / '.join(cols['stp'])} % | {' / '.join(cols['slo'])} % ({' / '.join(cols['bslo'])}) |")
