#!/usr/bin/env python3
"""Figures for `xsilo bench p2p` results (run by `xsilo bench plot --in DIR`).

Reads DIR/p2p.json and writes, per environment:
  fig4a-latency-ENV.png       (a) median latency per tier and backend (p95 as error bar),
                              with the floor (bytes / filled-link throughput + RTT)
  fig4b-speedup-ENV.png       (b) speedup of 10 concurrent sends (5 for large) over sequential
  fig4c-memory-ENV.png        (c) sender peak memory during a concurrent broadcast
  fig2-dispatch-ENV-TIER.png  Figure 2: sender peak memory vs concurrent dispatches
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
    sys.exit("plot_p2p: matplotlib missing (apt-get install python3-matplotlib)")

TIERS = ["small", "medium", "big", "large"]


def ok_runs(report, env):
    return [r for r in report["runs"] if r["env"] == env and "error" not in r]


def grouped_bars(ax, runs, value, err=None, floor=None):
    tiers = [t for t in TIERS if any(r["tier"] == t for r in runs)]
    backends = []
    for r in runs:
        if r["backend"] not in backends:
            backends.append(r["backend"])
    width = 0.8 / max(1, len(backends) + (1 if floor else 0))
    for i, b in enumerate(backends):
        xs, ys, es = [], [], []
        for j, t in enumerate(tiers):
            match = [r for r in runs if r["backend"] == b and r["tier"] == t]
            v = value(match[0]) if match else None
            if v is None:
                continue
            xs.append(j + i * width)
            ys.append(v)
            es.append(err(match[0]) - v if err else 0)
        ax.bar(xs, ys, width, label=b, yerr=[[0] * len(es), es] if err else None, capsize=2)
    if floor:
        xs, ys = [], []
        for j, t in enumerate(tiers):
            match = [r for r in runs if r["tier"] == t and floor(r) is not None]
            if match:
                xs.append(j + len(backends) * width)
                ys.append(floor(match[0]))
        ax.bar(xs, ys, width, label="floor", color="lightgray", hatch="//")
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(tiers))])
    ax.set_xticklabels(tiers)
    ax.legend(fontsize=8)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--in", dest="dir", required=True)
    a = p.parse_args()
    with open(os.path.join(a.dir, "p2p.json")) as f:
        report = json.load(f)
    written = []
    envs = []
    for r in report["runs"]:
        if r["env"] not in envs:
            envs.append(r["env"])
    links = {l["env"]: l for l in report.get("links", [])}
    for env in envs:
        runs = ok_runs(report, env)
        if not runs:
            continue
        link = links.get(env, {})
        sub = f"{env}" + (f", scale {link['scale']}" if env != "lan" and "scale" in link else "")

        fig, ax = plt.subplots(figsize=(7, 4))
        grouped_bars(ax, runs, lambda r: r["latency_median_ms"] / 1e3,
                     err=lambda r: r["latency_p95_ms"] / 1e3,
                     floor=lambda r: r["floor_ms"] / 1e3 if "floor_ms" in r else None)
        ax.set_yscale("log")
        ax.set_ylabel("latency, s (median; bar: p95)")
        ax.set_title(f"(a) one message, CPU to CPU ({sub})")
        out = os.path.join(a.dir, f"fig4a-latency-{env}.png")
        fig.tight_layout()
        fig.savefig(out, dpi=120)
        plt.close(fig)
        written.append(out)

        if any("concurrency" in r for r in runs):
            fig, ax = plt.subplots(figsize=(7, 4))
            grouped_bars(ax, [r for r in runs if "concurrency" in r],
                         lambda r: r["concurrency"]["speedup"])
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_ylabel("speedup (sequential / concurrent)")
            ax.set_title(f"(b) 10 concurrent sends (5 for large) ({sub})")
            out = os.path.join(a.dir, f"fig4b-speedup-{env}.png")
            fig.tight_layout()
            fig.savefig(out, dpi=120)
            plt.close(fig)
            written.append(out)

        if any("broadcast" in r for r in runs):
            fig, ax = plt.subplots(figsize=(7, 4))
            grouped_bars(ax, [r for r in runs if "broadcast" in r],
                         lambda r: r["broadcast"]["peak_bytes"] / 1e6)
            ax.set_yscale("log")
            peers = next(r["broadcast"]["peers"] for r in runs if "broadcast" in r)
            ax.set_ylabel("sender peak RSS, MB (VmHWM)")
            ax.set_title(f"(c) memory, broadcast to {peers} receivers ({sub})")
            out = os.path.join(a.dir, f"fig4c-memory-{env}.png")
            fig.tight_layout()
            fig.savefig(out, dpi=120)
            plt.close(fig)
            written.append(out)

        tiers = sorted({r["tier"] for r in runs if r.get("dispatch")})
        for tier in tiers:
            fig, ax = plt.subplots(figsize=(6, 4))
            for r in runs:
                if r["tier"] != tier or not r.get("dispatch"):
                    continue
                ns = [d["n"] for d in r["dispatch"]]
                ax.plot(ns, [d["peak_bytes"] / 1e6 for d in r["dispatch"]], marker="o",
                        label=r["backend"])
            tier_bytes = next(r["bytes"] for r in runs if r["tier"] == tier)
            ax.axhline(tier_bytes / 1e6, color="gray", linestyle=":", label="model size")
            ax.set_ylim(bottom=0)
            ax.set_xlabel("concurrent dispatches")
            ax.set_ylabel("sender peak RSS, MB (VmHWM)")
            ax.set_title(f"Figure 2: sender memory, {tier} tier ({sub})")
            ax.legend(fontsize=8)
            out = os.path.join(a.dir, f"fig2-dispatch-{env}-{tier}.png")
            fig.tight_layout()
            fig.savefig(out, dpi=120)
            plt.close(fig)
            written.append(out)
    for w in written:
        print("wrote", w)
    if not written:
        sys.exit("plot_p2p: no successful runs in " + a.dir)


if __name__ == "__main__":
    main()
