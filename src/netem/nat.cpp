// Sites behind a NAT (docs/netem.md "NAT").
//
// A NATed site is two namespaces joined by a veth pair: the host
// "<prefix>.<site>" (10.201.<i>.2/24 on "nat0", default route through the
// NAT box) and the NAT box "<prefix>.<site>-nat" (10.201.<i>.1/24 on
// "lan0", and the site's TUN device xs0 with the public address, which the
// router opens there). The NAT box forwards and translates with nftables;
// the rules for each type are written to the state directory
// (nat-<site>.nft) before they are loaded, so they can be read.
#include <fstream>

#include "instance_internal.h"
#include "sys.h"
#include "xsilo/netem/netem.h"

namespace xsilo::netem {

std::string_view NatTypeName(NatType type) {
  switch (type) {
    case NatType::kNone:
      return "none";
    case NatType::kFullCone:
      return "full-cone";
    case NatType::kRestricted:
      return "restricted";
    case NatType::kSymmetric:
      return "symmetric";
  }
  return "none";
}

Result<NatType> ParseNatType(std::string_view name) {
  for (NatType t :
       {NatType::kNone, NatType::kFullCone, NatType::kRestricted, NatType::kSymmetric}) {
    if (name == NatTypeName(t)) return t;
  }
  return InvalidArgument("unknown NAT type '" + std::string(name) +
                         "' (none, full-cone, restricted, symmetric)");
}

std::string SitePrivateAddress(int index) { return "10.201." + std::to_string(index) + ".2"; }

namespace internal {

namespace {

constexpr const char* kHostDevice = "nat0";  // in the host's namespace
constexpr const char* kLanDevice = "lan0";   // in the NAT box's namespace

std::string Subnet(int index) { return "10.201." + std::to_string(index) + ".0/24"; }
std::string Gateway(int index) { return "10.201." + std::to_string(index) + ".1"; }

}  // namespace

std::string NatNetnsName(const Options& o, const Site& s) { return NetnsName(o, s) + "-nat"; }

std::string NatRules(NatType type, int index) {
  const std::string host = SitePrivateAddress(index), pub = SiteAddress(index);
  const std::string lan = std::string("\"") + kLanDevice + "\"";
  const std::string wan = std::string("\"") + kDevice + "\"";
  const bool full_cone = type == NatType::kFullCone;
  // UDP through the endpoint-independent types is translated 1:1 without
  // connection tracking: the public port is always the host's port (one
  // host per NAT). With conntrack, a peer's datagram that reaches the NAT
  // before the host's first datagram to that peer (ICE's crossing checks)
  // leaves an entry whose tuple the host's flow would clash with, and
  // masquerade then picks another port: the mapping would depend on the
  // destination and timing (nat_test's CrossingTest).
  const bool stateless_udp = full_cone || type == NatType::kRestricted;
  std::string r = "table ip xsilo_nat {\n";
  if (full_cone) {
    // The ports the host has sent from.
    r += "  set mapped_udp { type inet_service; flags dynamic,timeout; timeout 180s; }\n";
    r += "  set mapped_tcp { type inet_service; flags dynamic,timeout; timeout 180s; }\n";
  } else if (stateless_udp) {
    // The peers the host has sent to, with the host's port.
    r += "  set sent_udp { type ipv4_addr . inet_service . inet_service; flags dynamic,timeout; "
         "timeout 180s; }\n";
  }
  if (stateless_udp) {
    // Who may send in: to a port the host sent from (full-cone), or from a
    // peer the host sent to from that port (restricted).
    const std::string admitted =
        full_cone ? "udp dport @mapped_udp" : "ip saddr . udp sport . udp dport @sent_udp";
    r += "  chain raw {\n    type filter hook prerouting priority raw; policy accept;\n";
    r += "    iifname " + lan + " ip saddr " + host + " meta l4proto udp notrack\n";
    r += "    iifname " + wan + " ip daddr " + pub + " " + admitted + " notrack ip daddr set " +
         host + "\n";
    r += "  }\n";
    r += "  chain snat_udp {\n    type filter hook postrouting priority srcnat; policy accept;\n";
    r +=
        "    oifname " + wan + " ip saddr " + host + " meta l4proto udp ip saddr set " + pub + "\n";
    r += "  }\n";
  }
  r += "  chain forward {\n    type filter hook forward priority filter; policy drop;\n";
  if (full_cone) {
    // Before the established rule, so that traffic keeps a mapping alive.
    r += "    iifname " + lan + " update @mapped_udp { udp sport }\n";
    r += "    iifname " + lan + " update @mapped_tcp { tcp sport }\n";
  } else if (stateless_udp) {
    r += "    iifname " + lan + " update @sent_udp { ip daddr . udp dport . udp sport }\n";
  }
  if (stateless_udp) {
    // Untracked UDP from outside is what the raw chain admitted.
    r += "    iifname " + wan + " meta l4proto udp ct state untracked accept\n";
    // The host's ICMP errors about untracked UDP match no connection and
    // would leave with its private address: they stay inside.
    r += "    iifname " + lan + " meta l4proto icmp ct state invalid drop\n";
  }
  r += "    ct state established,related accept\n";
  if (full_cone) r += "    ct status dnat accept\n";
  r += "    iifname " + lan + " oifname " + wan + " accept\n  }\n";
  if (full_cone) {
    r += "  chain prerouting {\n    type nat hook prerouting priority dstnat; policy accept;\n";
    r += "    iifname " + wan + " tcp dport @mapped_tcp dnat to " + host + "\n";
    r += "  }\n";
  }
  r += "  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n";
  r += "    oifname " + wan + " ip saddr " + Subnet(index) + " masquerade" +
       (type == NatType::kSymmetric ? " random" : "") + "\n  }\n}\n";
  return r;
}

Status CheckNatPrerequisites() {
  auto nft = RunCommand({"nft", "--version"}, std::chrono::seconds(5));
  if (!nft.ok()) {
    return FailedPrecondition(
        "sites behind a NAT need the `nft` command of nftables (apt-get install nftables): " +
        nft.status().message());
  }
  return Status::OK();
}

Status SetUpNat(const Topology& t, const Options& o, int index) {
  const Site& s = t.sites[index];
  const std::string host_ns = NetnsName(o, s), nat_ns = NatNetnsName(o, s);
  const std::string mtu = std::to_string(SiteMtu(t, static_cast<size_t>(index)));
  const std::string prefix_len = "/24";
  auto run = [&o](std::vector<std::string> argv) -> Status {
    auto r = RunCommand(argv, o.timeout);
    return r.ok() ? Status::OK() : r.status();
  };
  XSILO_RETURN_IF_ERROR(run({"ip", "netns", "add", nat_ns}));
  XSILO_RETURN_IF_ERROR(run({"ip", "link", "add", kHostDevice, "netns", host_ns, "mtu", mtu, "type",
                             "veth", "peer", "name", kLanDevice, "netns", nat_ns, "mtu", mtu}));
  XSILO_RETURN_IF_ERROR(run({"ip", "-n", host_ns, "addr", "add",
                             SitePrivateAddress(index) + prefix_len, "dev", kHostDevice}));
  XSILO_RETURN_IF_ERROR(run({"ip", "-n", host_ns, "link", "set", kHostDevice, "up"}));
  XSILO_RETURN_IF_ERROR(run({"ip", "-n", host_ns, "link", "set", "lo", "up"}));
  XSILO_RETURN_IF_ERROR(
      run({"ip", "-n", host_ns, "route", "add", "default", "via", Gateway(index)}));
  XSILO_RETURN_IF_ERROR(
      run({"ip", "-n", nat_ns, "addr", "add", Gateway(index) + prefix_len, "dev", kLanDevice}));
  XSILO_RETURN_IF_ERROR(run({"ip", "-n", nat_ns, "link", "set", kLanDevice, "up"}));
  XSILO_RETURN_IF_ERROR(run({"ip", "-n", nat_ns, "link", "set", "lo", "up"}));
  XSILO_RETURN_IF_ERROR(
      run({"ip", "netns", "exec", nat_ns, "sysctl", "-qw", "net.ipv4.ip_forward=1"}));
  const std::string rules_path = StateDir(o) + "/nat-" + s.name + ".nft";
  {
    std::ofstream out(rules_path);
    out << NatRules(s.nat, index);
    if (!out) return Internal("cannot write " + rules_path);
  }
  return run({"ip", "netns", "exec", nat_ns, "nft", "-f", rules_path})
      .WithContext("loading the " + std::string(NatTypeName(s.nat)) + " NAT rules of site " +
                   s.name);
}

}  // namespace internal
}  // namespace xsilo::netem
