// `xsilo bench`: the benchmark suite (docs/benchmarks.md); the benchmarks
// themselves are the xsilo_bench library.
//   p2p        latency, concurrency speedup, sender memory, serialization share
//              and the link's iperf3 reference, per environment, backend and tier
//   e2e        FedAvg end to end (cmd_bench_e2e.cpp)
//   plot       PNG figures (paper Figures 2, 4 and 5) from a results directory
//   p2p-peer   (internal) one party of a p2p measurement, started by `p2p`
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "commands.h"
#include "xsilo/bench/p2p.h"
#include "xsilo/bench/plot.h"

namespace xsilo::cli {

void AddBenchCommand(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks (docs/benchmarks.md)");
  bench->require_subcommand(1);

  auto args = std::make_shared<xsilo::bench::P2pOptions>();
  auto* p2p = bench->add_subcommand(
      "p2p", "Peer-to-peer study: latency, concurrency, memory, serialization, link floor");
  p2p->add_option("--envs", args->envs, "lan, geo-proximal, ca-va, ca-hk")->capture_default_str();
  p2p->add_option("--tiers", args->tiers, "small, medium, big, large")->capture_default_str();
  p2p->add_option("--backends", args->backends, "Backends to run")->capture_default_str();
  p2p->add_option("--repeats", args->repeats, "Timed sends per latency point")
      ->capture_default_str();
  p2p->add_option("--min-seconds", args->min_seconds,
                  "More timed sends until they add up to this many seconds (0 to 3600) per "
                  "latency point (at most " +
                      std::to_string(xsilo::bench::kP2pMaxTimedSends) +
                      " sends; 0 = exactly --repeats)")
      ->capture_default_str();
  p2p->add_option("--payload", args->payload,
                  "The model's values: pattern (a repeated ramp) or weights (Gaussian, as "
                  "compressible as trained weights; for BACKEND~CODEC rows)")
      ->capture_default_str();
  p2p->add_option("--scale", args->scale, "netem bandwidth scale (not lan)")->capture_default_str();
  p2p->add_flag("--quick", args->quick,
                "Preset: lan,ca-hk; small+medium (+big on lan); (b) on small only; grpc,grpc+s3; 2 "
                "repeats; scale 0.5; 3 s iperf3; dispatch 1,4,16; 2 broadcast peers");
  p2p->add_option("--out", args->out, "Results directory (default results/p2p-<date>)");
  p2p->add_option("--prefix", args->prefix, "netem instance prefix")->capture_default_str();
  p2p->add_option("--link-seconds", args->link_seconds,
                  "Seconds per iperf3 run (0 = no link reference)")
      ->capture_default_str();
  p2p->add_option("--broadcast-peers", args->broadcast_peers,
                  "Receivers of the concurrent broadcast (< 2 = no broadcast)")
      ->capture_default_str();
  p2p->add_option("--dispatch", args->dispatch, "Concurrent dispatches for Figure 2")
      ->capture_default_str();
  p2p->add_option("--dispatch-tier", args->dispatch_tier, "Tier of Figure 2")
      ->capture_default_str();
  p2p->add_option("--dispatch-envs", args->dispatch_envs, "Environments of Figure 2")
      ->capture_default_str();
  p2p->add_option("--passes", args->passes,
                  "Passes over each cell's backends, latencies pooled (slow spells of the "
                  "machine then fall on every backend alike); pass p starts at the p-th "
                  "backend")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  p2p->add_flag("--no-concurrency", args->no_concurrency, "Skip the 10-send speedup (b)");
  p2p->add_option("--backend-option", args->backend_options,
                  "NAME:KEY=VALUE added to a backend's options, e.g. grpc+s3:connections=32 "
                  "(repeatable)");
  p2p->add_option("--skip", args->skip_cells,
                  "ENV:TIER or ENV:TIER:BACKEND left out, e.g. ca-hk:large:grpc (repeatable)");
  p2p->callback([args, p2p] {
    for (const auto* opt : p2p->get_options())
      if (opt->count() > 0) args->explicit_flags.push_back(opt->get_name());
    std::exit(xsilo::bench::RunP2p(*args));
  });

  auto spec = std::make_shared<std::string>();
  auto* peer = bench->add_subcommand("p2p-peer", "(internal) one party of `bench p2p`");
  peer->add_option("--spec", *spec, "JSON spec")->required();
  peer->group("");  // hidden
  peer->callback([spec] { std::exit(xsilo::bench::RunP2pPeer(*spec)); });

  auto dir = std::make_shared<std::string>();
  AddBenchE2eCommand(bench);
  auto* plot = bench->add_subcommand("plot", "Render Figures 2 and 4 (PNG) from a results dir");
  plot->add_option("--in", *dir, "Results directory of `xsilo bench p2p`")->required();
  plot->callback([dir] { std::exit(xsilo::bench::RunPlot(*dir)); });
}

}  // namespace xsilo::cli
