// Private: what the parts of a netem instance share. instance.cpp: Up,
// Down, SetLinks and the queries; instance_state.cpp: validation and the
// state file; router_child.cpp: the forked router process.
#pragma once

#include <signal.h>

#include <cstdint>
#include <string>

#include "xsilo/netem/netem.h"

namespace xsilo::netem::internal {

inline constexpr const char* kRouterName = "xsilo-netem-rt";  // /proc/PID/comm
inline constexpr const char* kDevice = "xs0";
// Longer delays are surely a unit mistake (and would overflow nanoseconds).
inline constexpr double kMaxDelayMs = 3'600'000;

// The state directory and file of an instance, and a site's namespace.
std::string StateDir(const Options& o);
std::string StatePath(const Options& o);
std::string NetnsName(const Options& o, const Site& s);

// nat.cpp: the NAT box of a site behind a NAT, its nftables rules
// (pure: for reading and tests), and what it needs.
std::string NatNetnsName(const Options& o, const Site& s);
std::string NatRules(NatType type, int index);
Status CheckNatPrerequisites();
// Creates the NAT box namespace, the veth pair, addresses, routes and rules
// (the host's namespace exists already; the router adds the TUN device).
Status SetUpNat(const Topology& t, const Options& o, int index);

Status ValidatePrefix(const std::string& p);
Status ValidateTopology(const Topology& t);
uint32_t SiteMtu(const Topology& t, size_t i);

// Writes the state file atomically (a rename); links_version counts SetLinks.
Status WriteState(const Topology& t, const Options& o, int pid, uint64_t links_version = 0);
Result<State> ParseState(const std::string& text, const Options& o);
std::string ReadFile(const std::string& path);

// SIGUSR1 reloads the links; the others stop the router.
sigset_t RouterSignals();
// The forked router: opens the sites' TUN devices, reports "OK" (or the
// error) on ready_fd, forwards until a stop signal. Never returns.
[[noreturn]] void RouterChild(const Topology& t, const Options& o, int ready_fd);

}  // namespace xsilo::netem::internal
