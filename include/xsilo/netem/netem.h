// netem: a userspace WAN emulator for benchmarks on one machine.
//
// Each site of an environment is a Linux network namespace with one TUN
// device ("xs0", address 198.18.0.<index+1>/15). A router process, started by
// Up() and detached from its caller, owns every site's TUN file descriptor
// and forwards IP packets between sites, applying per directed link a
// one-way delay, a rate limit, optional jitter and random loss, and a
// bounded queue. Each site's TCP buffer limits (net.ipv4.tcp_rmem/tcp_wmem,
// per-namespace sysctls) cap what one TCP connection can reach.
//
// Needs root (CAP_NET_ADMIN + CAP_SYS_ADMIN), /dev/net/tun and iproute2's
// `ip`. Everything an instance creates is named after its prefix and
// recorded in a state directory, so Down() removes it even after a crash.
// See docs/netem.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo::netem {

// The shape of one directed link (packets from one site to another).
struct LinkShape {
  // One-way propagation delay in milliseconds. Default 0.
  double delay_ms = 0;
  // Serialization rate in MB/s (10^6 bytes of IP packets per second).
  // Default 0 = unlimited.
  double rate_MBps = 0;
  // Each packet's delay gets a uniform random extra in [-jitter, +jitter] ms;
  // packets on one link are never reordered. Default 0.
  double jitter_ms = 0;
  // Probability in [0, 1) that a packet is dropped at random. Default 0.
  double loss = 0;
  // Bytes that may wait for the serializer before packets are dropped.
  // Default 0 = derived from the rate and delay (DefaultQueueBytes).
  uint64_t queue_bytes = 0;
};

// What the profile promises for a client's link to the server (scaled).
struct LinkTarget {
  double rtt_ms = 0;       // 2 x one-way latency
  double single_MBps = 0;  // one TCP connection
  double multi_MBps = 0;   // many TCP connections (the link's rate)
};

// How a site sits behind a NAT (docs/netem.md "NAT"). A NATed site's host
// lives in its own namespace on a private subnet (10.201.<index>.0/24),
// behind a NAT box namespace "<prefix>.<site>-nat" that holds the site's
// TUN device and public address and translates with nftables.
enum class NatType {
  kNone,  // the host holds the public address: anyone can dial it
  // Endpoint-independent mapping and filtering: once the host has sent from
  // port P (UDP or TCP), anyone may send to P of the public address.
  kFullCone,
  // Endpoint-independent mapping, address-and-port-dependent filtering:
  // only the address:port the host sent to may answer (Linux masquerade).
  kRestricted,
  // A fresh random public port per destination address:port; only that
  // destination may answer. Hole punching fails through it.
  kSymmetric,
};
// "none", "full-cone", "restricted", "symmetric".
std::string_view NatTypeName(NatType type);
// InvalidArgument naming the accepted values.
Result<NatType> ParseNatType(std::string_view name);

struct Site {
  // "server", "client1", "client2", ... (names a site in Exec and status).
  std::string name;
  // The profile region ("hong-kong"), empty for hand-built topologies.
  std::string region;
  // net.ipv4.tcp_rmem / tcp_wmem maximum inside the site, in bytes.
  // Default 0 = leave the kernel's value.
  uint64_t tcp_rmem_max = 0;
  uint64_t tcp_wmem_max = 0;
  // MTU of the site's TUN device. Default 0 = Topology::mtu.
  uint32_t mtu = 0;
  // Targets of this site's link to the server (clients only).
  LinkTarget target;
  // Default kNone. Not for loopback topologies.
  NatType nat = NatType::kNone;
};

struct Topology {
  // Environment name ("ca-va", "lan", ... or "custom"). Default "custom".
  std::string env = "custom";
  // The factor every bandwidth was multiplied by. Default 1.
  double scale = 1;
  // MTU of the sites whose Site::mtu is 0. Default 64000 (fewer packets,
  // less router CPU per byte).
  uint32_t mtu = 64000;
  // sites[0] is the server. At most 200 sites.
  std::vector<Site> sites;
  // links[from][to] for from != to; must be sites.size() x sites.size().
  std::vector<std::vector<LinkShape>> links;
  // True for "lan": no namespaces and no router; every site is 127.0.0.1.
  bool loopback = false;
};

// The environments of a link-profile file, in file order.
// `profiles_path` empty = the copy of data/link-profiles.json built into xsilo.
Result<std::vector<std::string>> Environments(const std::string& profiles_path = "");

// Builds the topology of `env` with every bandwidth multiplied by `scale`:
// the server site plus one site per client. The link between the server and
// a client takes the client's region profile in both directions (delay =
// latency_ms, rate = multi_MBps); two clients are joined by the path through
// the server (delays added, the smaller rate). A client's MTU and TCP buffers are
// sized from single_MBps x RTT (see SizeForWindow); the server's buffers
// are large enough never to be the limit.
Result<Topology> LoadTopology(std::string_view env, double scale,
                              const std::string& profiles_path = "");

// How a site makes one TCP connection keep `window_bytes` in flight: the
// buffer limit is the window plus the kernel's overhead (it charges each
// segment's whole skb against the buffer and advertises part of the free
// space), and the MTU is small enough that the window spans at least 8
// segments (a sender sends whole segments, so coarse ones make the rate
// jump), but at most 64000.
struct WindowSizing {
  uint32_t mtu = 0;
  uint32_t segments = 0;
  uint64_t tcp_buffer = 0;  // for tcp_rmem[2] and tcp_wmem[2]
};
WindowSizing SizeForWindow(uint64_t window_bytes);

// The shape of a client's link to the server under profile `name`: a region
// ("hong-kong") or an environment with exactly one client ("ca-hk", which
// names its client's region). delay = latency_ms, rate = multi_MBps x scale;
// jitter, loss and queue_bytes are 0.
Result<LinkShape> ProfileLink(std::string_view name, double scale,
                              const std::string& profiles_path = "");

// The queue bound used when LinkShape::queue_bytes is 0.
uint64_t DefaultQueueBytes(const LinkShape& link, uint32_t mtu);

// The IPv4 address of site `index` (0 = server): "198.18.0.<index+1>". For
// a NATed site it is the NAT's public address.
std::string SiteAddress(int index);
// The address of a NATed site's host on its private subnet: "10.201.<index>.2".
std::string SitePrivateAddress(int index);

struct Options {
  // Names this instance: namespaces are "<prefix>.<site>". Letters, digits
  // and '-', at most 32 characters. Default "xsilo".
  std::string prefix = "xsilo";
  // Where the state file, router log and statistics live.
  // Default "" = /run/xsilo-netem/<prefix>.
  std::string state_dir;
  // How long Up waits for the router to be ready and Down waits for
  // processes to exit before killing them. Default 10 s.
  std::chrono::milliseconds timeout = std::chrono::seconds(10);
};

// OK when this process can run the emulator; otherwise a PermissionDenied or
// FailedPrecondition Status that says exactly what is missing.
Status CheckPrerequisites();

// Creates the namespaces and starts the router. Fails with AlreadyExists if
// the instance is up; cleans up a crashed instance of the same prefix first.
Status Up(const Topology& topology, const Options& options = {});

// Stops the router, kills every process left inside the sites, deletes the
// namespaces and the state directory. Idempotent; OK when nothing is up.
Status Down(const Options& options = {});

struct SiteState {
  Site site;
  std::string netns;  // namespace of the site's host, empty for loopback
  // IPv4 address of the site's host (what its servers bind): the private
  // address behind a NAT, otherwise the public one.
  std::string address;
  // The address the other sites see and dial (the NAT's, behind a NAT).
  std::string public_address;
  std::string nat_netns;  // the NAT box's namespace, empty without NAT
};

struct State {
  Topology topology;
  std::string prefix;
  std::string state_dir;
  int router_pid = 0;         // 0 for loopback
  bool router_alive = false;  // the router process runs
  // How many times SetLinks changed the links since Up (0 = as Up made them).
  uint64_t links_version = 0;
  // The router re-reads its links on SIGUSR1 (false for an instance that an
  // older xsilo started: its router would die of that signal).
  bool live_links = false;
  std::vector<SiteState> sites;
};

// The running instance, or NotFound when none is up.
Result<State> LoadState(const Options& options = {});

// Changes the shapes of the running instance's links while it runs: writes
// `links` (sites x sites; the diagonal is ignored) into the state file,
// signals the router (SIGUSR1) and waits, at most options.timeout, until the
// router reports it has switched. The router neither restarts nor drops
// packets or connections: packets it already holds keep their schedule, and
// every packet it reads afterwards gets the new shape (see docs/netem.md).
// Sites' MTUs and TCP buffers keep the values of Up. Errors: NotFound when no
// instance is up, FailedPrecondition when it has no router (loopback) or the
// router is not running or predates live changes, InvalidArgument for a bad
// shape, Timeout when the router does not confirm. Two concurrent calls: the
// last writer's matrix wins.
Status SetLinks(const std::vector<std::vector<LinkShape>>& links, const Options& options = {});

// Index of the site named `name` (or, if unique, whose region is `name`).
Result<int> FindSite(const State& state, std::string_view name);

// Moves the calling thread into the site's network namespace (a no-op for
// loopback). Sockets the thread opens afterwards belong to the site.
Status EnterSite(const State& state, int site);

// Per-link counters the router writes to its state directory every second.
struct LinkStats {
  int from = 0;
  int to = 0;
  uint64_t packets = 0;        // forwarded
  uint64_t bytes = 0;          // forwarded
  uint64_t dropped_queue = 0;  // queue full
  uint64_t dropped_loss = 0;   // random loss
};
Result<std::vector<LinkStats>> ReadLinkStats(const State& state);

// Router CPU time (user + system) in seconds, from /proc/<pid>/stat.
Result<double> ProcessCpuSeconds(int pid);

}  // namespace xsilo::netem
