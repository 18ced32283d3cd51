#!/usr/bin/env python3
"""Figure 5 for `xsilo bench e2e` results (run by `xsilo bench plot --in DIR`).

Reads DIR/e2e.json and writes DIR/fig5-states-ENV.png: per tier, one pair
of stacked bars per backend (the server, and the mean over clients) with
the seconds each party spent in train, aggregate, communication,
serialization, wait and CPU-GPU migration over the whole job.
Needs matplotlib (Debian: python3-matplotlib).
"""
import argparse
import json
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:
    sys.exit("plot_e2e: matplotlib missing (apt-get install python3-matplotlib)")

STATES = ["train", "aggregate", "communication", "serialization", "wait", "migration"]
COLORS = ["#4c72b0", "#55a868", "#c44e52", "#8172b2", "#ccb974", "#64b5cd"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--in", dest="dir", required=True)
    args = ap.parse_args()
    with open(os.path.join(args.dir, "e2e.json")) as f:
        report = json.load(f)
    runs = [r for r in report["runs"] if r.get("ok")]
    if not runs:
        sys.exit("plot_e2e: no successful runs in e2e.json")
    tiers = []
    for r in runs:
        if r["tier"] not in tiers:
            tiers.append(r["tier"])
    fig, axes = plt.subplots(1, len(tiers), figsize=(5 * len(tiers), 4.5), squeeze=False)
    for ax, tier in zip(axes[0], tiers):
        rows = [r for r in runs if r["tier"] == tier]
        labels, bottoms = [], []
        bars = {s: [] for s in STATES}
        for r in rows:
            for party, key in (("server", "server"), ("clients", "clients_mean")):
                labels.append(f"{r['backend']}\n{party}")
                for s in STATES:
                    bars[s].append(r[key].get(s, 0.0))
        x = list(range(len(labels)))
        bottom = [0.0] * len(labels)
        for s, c in zip(STATES, COLORS):
            ax.bar(x, bars[s], bottom=bottom, color=c, label=s)
            bottom = [b + v for b, v in zip(bottom, bars[s])]
        ax.set_xticks(x)
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("seconds over the job")
        ax.set_title(f"{report['env']}, {tier} tier, {report['rounds']} rounds")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    out = os.path.join(args.dir, f"fig5-states-{report['env']}.png")
    fig.savefig(out, dpi=120)
    print(out)


if __name__ == "__main__":
    main()
