// FedAvg end to end, the paper's Figure 5, behind `xsilo bench e2e`.
//
// For each backend and tier: 1 server and N clients (default 7), each its
// own `xsilo fl server` / `xsilo fl client` process, run a whole FedAvg job
// (the built-in MLP on Synthetic(alpha, beta), one local epoch per round by
// default). On `lan` every party is on loopback; on an emulated environment
// (geo-proximal, geo-distributed, ca-va, ca-hk) the server runs in the
// emulator's `server` site and client k in site `client<k>` (for
// geo-distributed, the 7 regions of the profile), so every model and update
// crosses that client's emulated link. The server's job report gives the
// per-state seconds of every party (train, aggregate, communication,
// serialization, wait, migration), which RunE2e tabulates and writes as
// JSON and CSV, and `xsilo bench plot --in DIR` draws as stacked bars.
#pragma once

#include <cstdint>
#include <string>

namespace xsilo::bench {

struct E2eOptions {
  // lan (loopback) or an emulated environment (needs root).
  std::string env = "lan";
  // Comma lists: grpc, grpc-s4, grpc-unary, grpc+s3, tensorpipe; tiers.
  std::string backends = "grpc,grpc+s3";
  std::string tiers = "small,medium";
  // Clients (one per client site when emulated) and FedAvg rounds per job.
  int clients = 7;
  int rounds = 2;
  // Local work per round: `local_steps` SGD steps when non-zero, else epochs.
  uint64_t local_epochs = 1;
  uint64_t local_steps = 0;
  // Bandwidth scale of the emulated links.
  double scale = 1.0;
  // Seconds one job may take; also every deadline of the job.
  double timeout_s = 3600;
  // Results directory; default results/e2e-<env>-<UTC time>.
  std::string out;
  // netem instance name.
  std::string prefix = "xsilo-e2e";
};

// Runs every backend and tier, writes e2e.json and e2e.csv, prints a table.
// Returns the process exit status: 0 when every job succeeded, 1 on
// failures, 2 on bad options.
int RunE2e(const E2eOptions& options);

}  // namespace xsilo::bench
