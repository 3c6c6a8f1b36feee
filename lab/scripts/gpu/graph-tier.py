"""The co-location matrix's graph tier: services that replay one CUDA graph per request,
from calls of lab/scripts/gpu/slo-rounds.py (each one service beside one training at one
load), merged into a matrix file of docs/ beside its eager tier.

  python3 lab/scripts/gpu/graph-tier.py MATRIX RECORD [RECORD ...] [--rename FILE:OLD=NEW ...]

MATRIX is docs/colocation-matrix-<gpu>.json; RECORD a slo-rounds.json (or a copy of one)
of the same GPU model. The matrix gets `tiers.graph` (made anew from the records named)
and keeps `tiers.eager` (the calls of colocation-matrix.py); a matrix still in the layout
before the tiers has its `pairs` and `configs` moved into `tiers.eager` first.

Per pair (service, training, load): the alone p99 of each call (the mean of its three
alone runs), and per configuration the rounds of every call pooled: `p99_ratio` is the
geometric mean over rounds of the round's p99 over its call's alone p99, `p99_vs_mps` over
plain MPS's p99 in the same round, `train_vs_mps` the training's throughput over plain
MPS's in the same round (the protocol of docs/colocation.md). `--rename FILE:OLD=NEW`
gives a configuration of one record the name of its settings (`mmk` of a call made when
the default objective was 3x: `FILE:mmk=mmk-slo3x`). Per configuration over the pairs:
`mean_p99_ratio`, `mean_p99_vs_mps`, `mean_train_vs_mps`, the worst pair by p99, and the
same means per load (`by_load`). A record whose alone runs disagreed and that went on
(`--noisy-ok`) is kept with its verdict; one that stopped there has no rounds and is left
out.
"""
import argparse
import json
import math
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from importlib import import_module  # noqa: E402

short = import_module("colocation-matrix").short


def geomean(xs):
    return math.exp(statistics.fmean(math.log(x) for x in xs))


def renames(specs, files):
    out = {}
    for spec in specs:
        where, colon, kv = spec.rpartition(":")
        old, _, new = kv.partition("=")
        if not colon or not old or not new or os.path.normpath(where) not in files:
            raise SystemExit(f"--rename {spec}: not FILE:OLD=NEW with FILE a record named")
        out.setdefault(os.path.normpath(where), {})[old] = new
    return out


def rounds_of(path, rec, names):
    """(pair key, alone p99, [(config, round's figures, plain MPS's in that round)])."""
    s = rec["setup"]
    key = (s["service"], s["training"], float(s["load"]))
    if not rec.get("alone") or not rec.get("rounds"):
        return key, None, []
    alone = statistics.fmean(x["p99_ms"] for x in rec["alone"])
    out = []
    for r in rec["rounds"]:
        mps = r.get("mps")
        if not mps or "error" in mps:
            continue
        for config, c in r.items():
            if "error" in c:
                continue
            out.append((names.get(config, config), c, mps))
    return key, alone, out


def pair_figures(runs):
    configs = {}
    for config in sorted({c for c, _, _, _ in runs}):
        these = [(a, c, m) for name, a, c, m in runs if name == config]
        slo = config.removeprefix("mmk-slo") if config.startswith("mmk-slo") else None
        configs[config] = {
            "rounds": len(these),
            "p99_ms": [c["p99_ms"] for _, c, _ in these],
            "p99_ratio": geomean([c["p99_ms"] / a for a, c, _ in these]),
            "p99_vs_mps": geomean([c["p99_ms"] / m["p99_ms"] for _, c, m in these]),
            "train_vs_mps": geomean([c["train_steps_per_s"] / m["train_steps_per_s"]
                                     for _, c, m in these]),
            "slo": slo,
            "isolation_seen": sorted({st["isolation"] for _, c, _ in these
                                      for st in c.get("slo_status", [])}),
        }
    return configs


def summarize(pairs):
    out = {}
    for config in sorted({c for p in pairs for c in p["configs"]}):
        cs = [(p, p["configs"][config]) for p in pairs if config in p["configs"]]

        def means(group):
            return {f"mean_{k}": statistics.fmean(c[k] for _, c in group)
                    for k in ("p99_ratio", "p99_vs_mps", "train_vs_mps")}
        worst = max(cs, key=lambda pc: pc[1]["p99_ratio"])
        out[config] = {
            "pairs": len(cs), **means(cs),
            "worst_p99_pair": f"{worst[0]['online']}+{worst[0]['offline']}@{worst[0]['load']}",
            "worst_p99_ratio": worst[1]["p99_ratio"],
            "by_load": {str(load): means([pc for pc in cs if pc[0]["load"] == load])
                        for load in sorted({p["load"] for p, _ in cs})},
        }
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("matrix")
    ap.add_argument("records", nargs="+")
    ap.add_argument("--rename", action="append", default=[])
    a = ap.parse_args()
    matrix = json.load(open(a.matrix))
    if "tiers" not in matrix:
        eager = {k: matrix.pop(k) for k in ("date", "command", "renamed", "pairs", "configs")
                 if k in matrix}
        matrix["tiers"] = {"eager": eager}
    files = [os.path.normpath(f) for f in a.records]
    names = renames(a.rename, set(files))
    by_pair, used, dates, commands = {}, [], [], []
    for f in files:
        rec = json.load(open(f))
        if short(rec["gpu"]) != short(matrix["gpu"]):
            raise SystemExit(f"{f}: a {rec['gpu']} record for a {matrix['gpu']} matrix")
        key, alone, runs = rounds_of(f, rec, names.get(f, {}))
        if not runs:
            print(f"{f}: no rounds ({rec.get('verdict', 'none ran')}): left out", file=sys.stderr)
            continue
        p = by_pair.setdefault(key, {"alone_p99_ms": [], "runs": [], "records": [],
                                     "verdicts": []})
        p["alone_p99_ms"].append(alone)
        p["runs"] += [(config, alone, c, m) for config, c, m in runs]
        p["records"].append(f)
        if rec.get("verdict"):
            p["verdicts"].append(rec["verdict"])
        used.append(f)
        dates.append(rec["date"])
        commands.append(rec["command"])
    if not used:
        raise SystemExit("no record had rounds: nothing to merge")
    pairs = [{"online": s, "offline": t, "load": load, "records": p["records"],
              "alone_p99_ms": p["alone_p99_ms"], "verdicts": p["verdicts"],
              "configs": pair_figures(p["runs"])}
             for (s, t, load), p in sorted(by_pair.items())]
    matrix["tiers"]["graph"] = {
        "date": max(dates), "records": used, "command": sorted(set(commands)),
        "renamed": {f"{f}:{o}": n for f, m in names.items() for o, n in m.items()},
        "pairs": pairs, "configs": summarize(pairs)}
    with open(a.matrix, "w") as out:
        json.dump(matrix, out, indent=1)
        out.write("\n")
    for config, c in matrix["tiers"]["graph"]["configs"].items():
        print(f"{config:14} pairs {c['pairs']}  p99/alone {c['mean_p99_ratio']:.2f}  "
              f"p99/mps {c['mean_p99_vs_mps']:.2f}  training/mps {c['mean_train_vs_mps']:.2f}")


if __name__ == "__main__":
    main()
