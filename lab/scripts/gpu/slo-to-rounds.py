"""An `slo-rounds.py` record cut to the `rounds.json` layout the simulator reads
(`KernelEffect::from_rounds` in lab/simulator/src/kernel.rs): `configs` with, per
configuration and round (`NAME`, then `NAME@2`, ...), the service's requests, p50, p99
and mean latency and the training's steps a second; `ideal`, `ideal@2`, ... the service's
alone runs. Runs that failed are left out.

Usage: python3 lab/scripts/gpu/slo-to-rounds.py slo-rounds.json > NAME.rounds.json
"""
import json
import sys

KEEP = ("requests", "p50_ms", "p99_ms", "mean_ms", "train_steps_per_s")


def name(base, i):
    return base if i == 0 else f"{base}@{i + 1}"


def main():
    res = json.load(open(sys.argv[1]))
    configs = {}
    for i, alone in enumerate(res.get("alone", [])):
        configs[name("ideal", i)] = {k: alone[k] for k in KEEP if k in alone}
    for i, rnd in enumerate(res.get("rounds", [])):
        for config, run in rnd.items():
            if "error" not in run:
                configs[name(config, i)] = {k: run[k] for k in KEEP if k in run}
    setup = res.get("setup", {})
    json.dump({"gpu": res.get("gpu"), "driver": res.get("driver"), "date": res.get("date"),
               "command": res.get("command"), "service": setup.get("service"),
               "training": setup.get("training"), "configs": configs},
              sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
