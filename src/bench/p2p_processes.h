// The peer processes of `bench p2p`, as the coordinator starts, watches and
// stops them; and the clean-up on a signal.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "bench/p2p_peer.h"
#include "xsilo/core/status.h"

namespace xsilo::bench {

// Blocks SIGINT, SIGTERM and SIGHUP in the calling thread (and so in every
// thread it starts later) and starts, once, a thread that waits for them and
// cleans up: kills the peers, takes netem instance `netem_prefix` down while
// SetNetemUp(true) holds, removes `tmpdir`, and exits.
void StartSignalWatcher(const std::string& netem_prefix, const std::string& tmpdir);
void SetNetemUp(bool up);

// After a signal, the watcher thread cleans up and exits the process: this
// parks the calling thread for good. Returns at once otherwise.
void ParkIfStopping();

// This binary as `xsilo bench p2p-peer --spec JSON`, in its own process
// group, stdout and stderr appended to `log`.
Result<pid_t> SpawnPeer(const PeerSpec& spec, const std::string& log);

// Every rank of an MPI backend under one mpirun (lan: one host, TCP forced).
// Each rank takes its rank from OMPI_COMM_WORLD_RANK.
Result<pid_t> SpawnMpiPeers(const PeerSpec& spec, const std::string& log);

// True once `pid` (our child) exited; does not reap it.
bool Exited(pid_t pid);

// Waits for every pid until `deadline`; kills the groups of those left.
// Returns the number that failed (non-zero exit, signal, or killed).
// Once the first pid (the sender) has exited, the others get `orphan_grace`
// more: a receiver the sender never released would otherwise wait out its
// idle timeout. *orphaned (optional) is set when that killed any.
int WaitPeers(const std::vector<pid_t>& pids, std::chrono::steady_clock::time_point deadline,
              bool* timed_out, std::chrono::seconds orphan_grace = std::chrono::seconds(90),
              bool* orphaned = nullptr);

}  // namespace xsilo::bench
