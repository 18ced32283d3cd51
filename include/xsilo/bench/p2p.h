// The peer-to-peer study behind `xsilo bench p2p` (docs/benchmarks.md):
// latency, concurrency speedup, sender memory, serialization share and the
// link's iperf3 reference, per environment, backend and tier.
//
// Every measurement runs in two or more fresh processes: the sender (rank 0)
// in the emulator's `server` site, the receivers (ranks 1..) in `client1`.
// The coordinator (RunP2p) only brings the environment up, starts the peers
// (this executable as `bench p2p-peer --spec JSON`), collects their result
// file and tears everything down.
#pragma once

#include <string>
#include <vector>

namespace xsilo::bench {

// Every backend the study knows, in its order.
inline constexpr const char* kP2pBackends =
    "grpc,grpc-s4,grpc-unary,grpc+s3,auto+s3,mpi-generic,mpi-buffer,tensorpipe,grpc-tls,"
    "grpc+s3-tls,grpc+endpoint,grpc+endpoint-relayed";

// Most timed sends of one latency point that --min-seconds asks for.
inline constexpr int kP2pMaxTimedSends = 2000;

struct P2pOptions {
  // Comma lists of environments (link profiles), tiers and backends.
  std::string envs = "lan,geo-proximal,ca-va,ca-hk";
  std::string tiers = "small,medium,big,large";
  std::string backends = kP2pBackends;
  // Timed sends per latency point (after one warm-up send).
  int repeats = 5;
  // More timed sends, until a latency point's timed sends add up to this
  // many seconds (at most kP2pMaxTimedSends): a cell of milliseconds then
  // gets hundreds of samples, a cell of seconds its `repeats`. 0 = exactly
  // `repeats`.
  double min_seconds = 0;
  // The model's values (xsilo/bench/model.h): "pattern" (the committed
  // figures) or "weights" (Gaussian, as compressible as real weights; the
  // payload for rows with compression, whose lossy copies it can check).
  std::string payload = "pattern";
  // Passes over a cell's backends: each pass runs every backend once more
  // (fresh processes, `repeats` more timed sends), in the same order, and
  // the latency samples of all passes are pooled. With several passes the
  // machine's slow spells fall on every backend alike instead of on the
  // one that happened to run then. (b), Figure 2 and the broadcast are
  // measured in the first pass only.
  int passes = 1;
  // netem bandwidth scale (not lan).
  double scale = 0.1;
  // The quick preset: lan,ca-hk; small+medium (+big on lan); (b) on small
  // only; grpc,grpc+s3; 2 repeats; scale 0.5; 3 s iperf3; dispatch 1,4,16;
  // 2 broadcast peers. It leaves the options in `explicit_flags` alone.
  bool quick = false;
  // Results directory; default results/p2p-<UTC time>.
  std::string out;
  // netem instance prefix.
  std::string prefix = "xsilo-p2p";
  // Seconds per iperf3 run; 0 = no link reference.
  int link_seconds = 8;
  // Receivers of the concurrent broadcast; < 2 = no broadcast.
  int broadcast_peers = 4;
  // Figure 2: the concurrent dispatch counts, its tier and environments.
  std::string dispatch = "1,2,5,10,20,30,40,50";
  std::string dispatch_tier = "medium";
  std::string dispatch_envs = "lan";
  // Skip the 10-send speedup (b).
  bool no_concurrency = false;
  // NAME:KEY=VALUE, added to backend NAME's options.
  std::vector<std::string> backend_options;
  // ENV:TIER or ENV:TIER:BACKEND cells left out (recorded in not_run), e.g.
  // ca-hk:large:grpc for a cell that would take tens of minutes.
  std::vector<std::string> skip_cells;
  // The command-line flags given explicitly ("--envs", "--tiers", ...).
  std::vector<std::string> explicit_flags;
};

// Runs the study and writes p2p.json, p2p.csv, dispatch.csv and links.csv
// to `options.out`, printing progress and a summary table. Returns the
// process exit status: 0 when every run succeeded, 1 on failures, 2 on bad
// options.
int RunP2p(P2pOptions options);

// One party of a measurement, from the JSON spec the coordinator passes.
// Returns the process exit status.
int RunP2pPeer(const std::string& spec_json);

}  // namespace xsilo::bench
