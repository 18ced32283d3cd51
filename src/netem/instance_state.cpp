// A netem instance's validation and its state file
// (<state dir>/state.json: the topology, the router's pid, the links).
#include <unistd.h>

#include <cctype>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "instance_internal.h"
#include "sys.h"

namespace xsilo::netem {

namespace internal {

using nlohmann::json;

std::string StateDir(const Options& o) {
  return o.state_dir.empty() ? "/run/xsilo-netem/" + o.prefix : o.state_dir;
}
std::string StatePath(const Options& o) { return StateDir(o) + "/state.json"; }
std::string NetnsName(const Options& o, const Site& s) { return o.prefix + "." + s.name; }

Status ValidatePrefix(const std::string& p) {
  if (p.empty() || p.size() > 32) return InvalidArgument("prefix must have 1 to 32 characters");
  for (char c : p) {
    if (!isalnum(static_cast<unsigned char>(c)) && c != '-') {
      return InvalidArgument("prefix '" + p + "' may hold only letters, digits and '-'");
    }
  }
  return Status::OK();
}

Status ValidateTopology(const Topology& t) {
  const size_t n = t.sites.size();
  if (n < 2 || n > 200) return InvalidArgument("a topology needs 2 to 200 sites");
  if (t.links.size() != n) return InvalidArgument("links must be sites x sites");
  for (size_t from = 0; from < n; ++from) {
    if (t.links[from].size() != n) return InvalidArgument("links must be sites x sites");
    for (size_t to = 0; to < n; ++to) {
      const LinkShape& l = t.links[from][to];
      // Written so that NaN fails every test.
      if (!(l.delay_ms >= 0 && l.delay_ms <= kMaxDelayMs) ||
          !(l.jitter_ms >= 0 && l.jitter_ms <= kMaxDelayMs) ||
          !(l.rate_MBps >= 0 && std::isfinite(l.rate_MBps)) || !(l.loss >= 0 && l.loss < 1)) {
        std::ostringstream shape;
        shape << "delay_ms " << l.delay_ms << ", rate_MBps " << l.rate_MBps << ", jitter_ms "
              << l.jitter_ms << ", loss " << l.loss;
        return InvalidArgument("link " + t.sites[from].name + "->" + t.sites[to].name + " (" +
                               shape.str() +
                               "): delay and jitter must be in [0, 3600000] ms, the rate finite "
                               "and >= 0, loss in [0, 1)");
      }
    }
  }
  if (t.mtu < 1280 || t.mtu > 65000) return InvalidArgument("mtu must be in [1280, 65000]");
  for (const auto& s : t.sites) {
    if (s.mtu != 0 && (s.mtu < 1280 || s.mtu > 65000)) {
      return InvalidArgument("site mtu must be 0 or in [1280, 65000]");
    }
  }
  std::set<std::string> names;
  for (const auto& s : t.sites) {
    if (s.name.empty() || s.name.find('.') != std::string::npos ||
        s.name.find('/') != std::string::npos || !names.insert(s.name).second) {
      return InvalidArgument("site names must be unique, non-empty, without '.' or '/'");
    }
  }
  for (const auto& s : t.sites) {
    if (s.nat == NatType::kNone) continue;
    if (t.loopback) {
      return InvalidArgument("site " + s.name +
                             " is behind a NAT, which needs namespaces: a loopback topology has "
                             "none");
    }
    if (names.count(s.name + "-nat")) {
      return InvalidArgument("site " + s.name + " is behind a NAT, whose namespace is named " +
                             s.name + "-nat: rename the site of that name");
    }
  }
  return Status::OK();
}

uint32_t SiteMtu(const Topology& t, size_t i) { return t.sites[i].mtu ? t.sites[i].mtu : t.mtu; }

namespace {

json LinkToJson(const LinkShape& l) {
  return {{"delay_ms", l.delay_ms},
          {"rate_MBps", l.rate_MBps},
          {"jitter_ms", l.jitter_ms},
          {"loss", l.loss},
          {"queue_bytes", l.queue_bytes}};
}

json StateToJson(const Topology& t, const Options& o, int pid, uint64_t links_version) {
  json sites = json::array();
  for (size_t i = 0; i < t.sites.size(); ++i) {
    const Site& s = t.sites[i];
    sites.push_back(
        {{"name", s.name},
         {"region", s.region},
         {"netns", t.loopback ? "" : NetnsName(o, s)},
         {"address", t.loopback                ? "127.0.0.1"
                     : s.nat != NatType::kNone ? SitePrivateAddress(static_cast<int>(i))
                                               : SiteAddress(static_cast<int>(i))},
         {"public_address", t.loopback ? "127.0.0.1" : SiteAddress(static_cast<int>(i))},
         {"nat", NatTypeName(s.nat)},
         {"nat_netns", s.nat != NatType::kNone ? NatNetnsName(o, s) : ""},
         {"tcp_rmem_max", s.tcp_rmem_max},
         {"tcp_wmem_max", s.tcp_wmem_max},
         {"mtu", SiteMtu(t, i)},
         {"target",
          {{"rtt_ms", s.target.rtt_ms},
           {"single_MBps", s.target.single_MBps},
           {"multi_MBps", s.target.multi_MBps}}}});
  }
  json links = json::array();
  for (const auto& row : t.links) {
    json r = json::array();
    for (const auto& l : row) r.push_back(LinkToJson(l));
    links.push_back(r);
  }
  // "links_version" also tells SetLinks that the router reloads on SIGUSR1.
  return {{"prefix", o.prefix},
          {"env", t.env},
          {"scale", t.scale},
          {"mtu", t.mtu},
          {"loopback", t.loopback},
          {"router_pid", pid},
          {"links_version", links_version},
          {"sites", sites},
          {"links", links}};
}

}  // namespace

Status WriteState(const Topology& t, const Options& o, int pid, uint64_t links_version) {
  std::string path = StatePath(o);
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << StateToJson(t, o, pid, links_version).dump(1) << "\n";
    if (!out) return Internal("cannot write " + tmp);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return Internal("rename " + tmp + ": " + strerror(errno));
  }
  return Status::OK();
}

Result<State> ParseState(const std::string& text, const Options& o) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Corrupt("state file is not JSON");
  try {
    State s;
    s.prefix = j.at("prefix").get<std::string>();
    s.state_dir = StateDir(o);
    s.router_pid = j.at("router_pid").get<int>();
    s.live_links = j.contains("links_version");
    s.links_version = j.value("links_version", uint64_t{0});
    Topology& t = s.topology;
    t.env = j.at("env").get<std::string>();
    t.scale = j.at("scale").get<double>();
    t.mtu = j.at("mtu").get<uint32_t>();
    t.loopback = j.at("loopback").get<bool>();
    for (const auto& js : j.at("sites")) {
      SiteState ss;
      ss.site.name = js.at("name").get<std::string>();
      ss.site.region = js.at("region").get<std::string>();
      ss.site.tcp_rmem_max = js.at("tcp_rmem_max").get<uint64_t>();
      ss.site.tcp_wmem_max = js.at("tcp_wmem_max").get<uint64_t>();
      ss.site.mtu = js.at("mtu").get<uint32_t>();
      const json& tg = js.at("target");
      ss.site.target = {tg.at("rtt_ms").get<double>(), tg.at("single_MBps").get<double>(),
                        tg.at("multi_MBps").get<double>()};
      ss.netns = js.at("netns").get<std::string>();
      ss.address = js.at("address").get<std::string>();
      // An instance that an older xsilo started has no NAT fields.
      ss.public_address = js.value("public_address", ss.address);
      ss.nat_netns = js.value("nat_netns", std::string());
      XSILO_ASSIGN_OR_RETURN(ss.site.nat, ParseNatType(js.value("nat", std::string("none"))));
      t.sites.push_back(ss.site);
      s.sites.push_back(std::move(ss));
    }
    for (const auto& jr : j.at("links")) {
      std::vector<LinkShape> row;
      for (const auto& jl : jr) {
        row.push_back(LinkShape{jl.at("delay_ms").get<double>(), jl.at("rate_MBps").get<double>(),
                                jl.at("jitter_ms").get<double>(), jl.at("loss").get<double>(),
                                jl.at("queue_bytes").get<uint64_t>()});
      }
      t.links.push_back(std::move(row));
    }
    s.router_alive = s.router_pid > 0 && internal::ProcessAlive(s.router_pid) &&
                     internal::ProcessName(s.router_pid) == kRouterName;
    return s;
  } catch (const json::exception& e) {
    return Corrupt(std::string("state file: ") + e.what());
  }
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace internal

using namespace internal;

Result<State> LoadState(const Options& o) {
  XSILO_RETURN_IF_ERROR(ValidatePrefix(o.prefix));
  std::string path = StatePath(o);
  if (access(path.c_str(), F_OK) != 0) {
    return NotFound("no netem instance '" + o.prefix + "' is up (no " + path + ")");
  }
  return ParseState(ReadFile(path), o);
}

}  // namespace xsilo::netem
