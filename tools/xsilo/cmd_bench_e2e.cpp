// `xsilo bench e2e`: FedAvg end to end, the paper's Figure 5
// (xsilo/bench/e2e.h).
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <memory>

#include "commands.h"
#include "xsilo/bench/e2e.h"

namespace xsilo::cli {

void AddBenchE2eCommand(CLI::App* bench) {
  auto a = std::make_shared<xsilo::bench::E2eOptions>();
  auto* e2e = bench->add_subcommand(
      "e2e", "FedAvg end to end (Figure 5): 1 server + N client processes per backend and tier");
  e2e->add_option("--env", a->env,
                  "lan (loopback) or an emulated environment: geo-proximal, geo-distributed, "
                  "ca-va, ca-hk (needs root)")
      ->capture_default_str();
  e2e->add_option("--backends", a->backends,
                  "comma list: grpc, grpc-s4, grpc-unary, grpc+s3, auto+s3, tensorpipe; "
                  "NAME~CODEC (auto, lossless, bf16, fp16, int8, topk, CAST+topk) for NAME "
                  "compressed, NAME~CODEC:whole for the same not streamed")
      ->capture_default_str();
  e2e->add_option("--tiers", a->tiers, "comma list of small, medium, big, large")
      ->capture_default_str();
  e2e->add_option("--clients", a->clients, "clients (one per client site when emulated)")
      ->capture_default_str();
  e2e->add_option("--rounds", a->rounds, "FedAvg rounds per job")->capture_default_str();
  e2e->add_option("--local-epochs", a->local_epochs, "local epochs per round")
      ->capture_default_str();
  e2e->add_option("--local-steps", a->local_steps, "local SGD steps per round (overrides epochs)")
      ->capture_default_str();
  e2e->add_option("--scale", a->scale, "bandwidth scale of the emulated links")
      ->capture_default_str();
  e2e->add_option("--timeout", a->timeout_s, "seconds one job may take")->capture_default_str();
  e2e->add_option("--out", a->out, "results directory (default results/e2e-<env>-<time>)");
  e2e->add_option("--prefix", a->prefix, "netem instance name")->capture_default_str();
  e2e->callback([a] { std::exit(xsilo::bench::RunE2e(*a)); });
}

}  // namespace xsilo::cli
