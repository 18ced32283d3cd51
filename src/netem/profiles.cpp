// Topologies from the link-profile file (data/link-profiles.json).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "xsilo/netem/netem.h"

namespace xsilo::netem {

namespace internal {
extern const char kBuiltinProfiles[];
}

namespace {

using json = nlohmann::ordered_json;  // keeps the file's order of environments

Result<json> ReadProfiles(const std::string& path) {
  std::string text;
  if (path.empty()) {
    text = internal::kBuiltinProfiles;
  } else {
    std::ifstream in(path);
    if (!in) return NotFound("cannot read link profiles " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
  }
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("regions") || !j.contains("environments")) {
    return Corrupt("link profiles " + (path.empty() ? "(built in)" : path) +
                   ": not a JSON object with regions and environments");
  }
  return j;
}

struct Region {
  double single_MBps, multi_MBps, latency_ms;
};

Result<Region> GetRegion(const json& profiles, const std::string& name) {
  const json& regions = profiles["regions"];
  if (!regions.contains(name)) return NotFound("link profiles: unknown region '" + name + "'");
  const json& r = regions[name];
  for (const char* k : {"single_MBps", "multi_MBps", "latency_ms"}) {
    if (!r.contains(k) || !r[k].is_number() || r[k].get<double>() <= 0) {
      return Corrupt("link profiles: region '" + name + "' lacks a positive " + k);
    }
  }
  return Region{r["single_MBps"].get<double>(), r["multi_MBps"].get<double>(),
                r["latency_ms"].get<double>()};
}

}  // namespace

namespace {
constexpr uint32_t kMaxMtu = 64000;
constexpr uint32_t kMinMtu = 1280;
constexpr uint32_t kHeaders = 52;  // IPv4 + TCP + timestamp option
constexpr uint32_t kMinSegments = 8;
// Window one connection sustains / buffer limit: the kernel charges each
// segment's whole skb (its truesize) against the buffer and advertises part
// of the free space. Measured with iperf3 over netem links on Linux 6.x
// (34 KB segments, buffers 313-390 KB): 0.745-0.76.
constexpr double kWindowPerBuffer = 0.75;
}  // namespace

WindowSizing SizeForWindow(uint64_t window_bytes) {
  const double w = static_cast<double>(std::max<uint64_t>(window_bytes, 1));
  uint32_t segments =
      std::max<uint32_t>(kMinSegments, static_cast<uint32_t>(std::ceil(w / (kMaxMtu - kHeaders))));
  double payload = w / segments;
  if (payload < kMinMtu - kHeaders) {  // a tiny window: smallest MTU, fewer segments
    payload = kMinMtu - kHeaders;
    segments = std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(w / payload)));
  }
  WindowSizing s;
  s.segments = segments;
  s.mtu = std::min<uint32_t>(kMaxMtu, static_cast<uint32_t>(std::lround(payload)) + kHeaders);
  s.tcp_buffer = static_cast<uint64_t>(std::ceil(w / kWindowPerBuffer));
  return s;
}

uint64_t DefaultQueueBytes(const LinkShape& link, uint32_t mtu) {
  // One bandwidth-delay product of the round trip ("rule of thumb" router
  // buffer), at least 16 full packets.
  double rtt_s = std::max(2 * link.delay_ms, 10.0) / 1e3;
  double bdp = link.rate_MBps * 1e6 * rtt_s;
  return std::max<uint64_t>(16ull * mtu, static_cast<uint64_t>(bdp));
}

Result<LinkShape> ProfileLink(std::string_view name, double scale,
                              const std::string& profiles_path) {
  if (!(scale > 0) || scale > 1000) return InvalidArgument("scale must be in (0, 1000]");
  XSILO_ASSIGN_OR_RETURN(json profiles, ReadProfiles(profiles_path));
  std::string region(name);
  const json& envs = profiles["environments"];
  if (!profiles["regions"].contains(region) && envs.contains(region)) {
    const json& e = envs[region];
    if (!e.contains("clients") || !e["clients"].is_array() || e["clients"].size() != 1 ||
        !e["clients"][0].is_string()) {
      return InvalidArgument("environment '" + region +
                             "' does not have exactly one client; name a region instead");
    }
    region = e["clients"][0].get<std::string>();
  } else if (!profiles["regions"].contains(region)) {
    std::string known;
    for (const auto& [n, _] : profiles["regions"].items()) known += (known.empty() ? "" : ", ") + n;
    return NotFound("no region or one-client environment '" + region + "' in the link profiles (" +
                    known + ")");
  }
  XSILO_ASSIGN_OR_RETURN(Region r, GetRegion(profiles, region));
  return LinkShape{.delay_ms = r.latency_ms, .rate_MBps = r.multi_MBps * scale};
}

std::string SiteAddress(int index) { return "198.18.0." + std::to_string(index + 1); }

Result<std::vector<std::string>> Environments(const std::string& profiles_path) {
  XSILO_ASSIGN_OR_RETURN(json profiles, ReadProfiles(profiles_path));
  std::vector<std::string> names;
  for (const auto& [name, _] : profiles["environments"].items()) names.push_back(name);
  return names;
}

Result<Topology> LoadTopology(std::string_view env, double scale,
                              const std::string& profiles_path) {
  if (!(scale > 0) || scale > 1000) return InvalidArgument("scale must be in (0, 1000]");
  XSILO_ASSIGN_OR_RETURN(json profiles, ReadProfiles(profiles_path));
  const json& envs = profiles["environments"];
  const std::string env_name(env);
  if (!envs.contains(env_name)) {
    std::string known;
    for (const auto& [name, _] : envs.items()) known += (known.empty() ? "" : ", ") + name;
    return NotFound("unknown environment '" + env_name + "' (" + known + ")");
  }
  const json& e = envs[env_name];
  Topology t;
  t.env = env_name;
  t.scale = scale;
  if (!e.contains("server")) {  // lan: plain loopback
    t.loopback = true;
    t.sites.push_back(Site{.name = "server"});
    t.sites.push_back(Site{.name = "client1"});
    t.links.assign(2, std::vector<LinkShape>(2));
    return t;
  }
  if (!e["server"].is_string() || !e.contains("clients") || !e["clients"].is_array() ||
      e["clients"].empty()) {
    return Corrupt("environment '" + env_name + "' needs a server and a list of clients");
  }
  const std::string server_region = e["server"].get<std::string>();
  XSILO_RETURN_IF_ERROR(GetRegion(profiles, server_region).status());
  t.sites.push_back(Site{.name = "server", .region = server_region});
  std::vector<LinkShape> to_server;  // client i+1 <-> server
  uint64_t largest_buffer = 0;
  for (const auto& c : e["clients"]) {
    if (!c.is_string()) return Corrupt("environment '" + env_name + "': client not a string");
    XSILO_ASSIGN_OR_RETURN(Region r, GetRegion(profiles, c.get<std::string>()));
    Site s;
    s.name = "client" + std::to_string(t.sites.size());
    s.region = c.get<std::string>();
    s.target = {.rtt_ms = 2 * r.latency_ms,
                .single_MBps = r.single_MBps * scale,
                .multi_MBps = r.multi_MBps * scale};
    double window = s.target.single_MBps * 1e6 * s.target.rtt_ms / 1e3;
    WindowSizing sizing = SizeForWindow(static_cast<uint64_t>(window));
    s.mtu = sizing.mtu;
    s.tcp_rmem_max = s.tcp_wmem_max = sizing.tcp_buffer;
    largest_buffer = std::max(largest_buffer, s.tcp_rmem_max);
    t.sites.push_back(s);
    to_server.push_back(LinkShape{.delay_ms = r.latency_ms, .rate_MBps = r.multi_MBps * scale});
  }
  // The server's buffers never limit a connection: the client side does,
  // in both directions (its receive buffer downstream, its send buffer
  // upstream).
  t.sites[0].tcp_rmem_max = t.sites[0].tcp_wmem_max =
      std::max<uint64_t>(8ull << 20, 4 * largest_buffer);

  const size_t n = t.sites.size();
  t.links.assign(n, std::vector<LinkShape>(n));
  for (size_t i = 1; i < n; ++i) {
    t.links[0][i] = t.links[i][0] = to_server[i - 1];
    for (size_t j = 1; j < n; ++j) {
      if (i == j) continue;
      const LinkShape& a = to_server[i - 1];
      const LinkShape& b = to_server[j - 1];
      t.links[i][j] = LinkShape{.delay_ms = a.delay_ms + b.delay_ms,
                                .rate_MBps = std::min(a.rate_MBps, b.rate_MBps)};
    }
  }
  return t;
}

}  // namespace xsilo::netem
