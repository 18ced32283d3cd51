// multi: policy routing over member connectors (see include/xsilo/store/multi.h).
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <regex>

#include "store/builtin.h"
#include "xsilo/store/multi.h"

namespace xsilo {

using nlohmann::json;

namespace {

constexpr const char* kRouteAttr = "multi.route";
constexpr const char* kTypeAttr = "multi.type";

bool ValidMemberName(const std::string& name) {
  if (name.empty() || name.size() > 64) return false;
  return std::all_of(name.begin(), name.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_';
  });
}

json MemberJson(const MultiMember& m) {
  const MultiPolicy& p = m.policy;
  return json{{"name", m.name},
              {"connector", json::parse(m.connector.ToJson())},
              {"min_size", p.min_size},
              {"max_size", p.max_size},
              {"subset_tags", p.subset_tags},
              {"superset_tags", p.superset_tags},
              {"host_pattern", p.host_pattern},
              {"priority", p.priority}};
}

Result<std::set<std::string>> TagSet(const json& j, const char* what) {
  std::set<std::string> out;
  if (!j.is_array()) return InvalidArgument(std::string("multi: ") + what + " is not an array");
  for (const auto& t : j) {
    if (!t.is_string())
      return InvalidArgument(std::string("multi: ") + what + " holds a non-string");
    out.insert(t.get<std::string>());
  }
  return out;
}

Result<MultiMember> MemberFrom(const json& j) {
  if (!j.is_object()) return InvalidArgument("multi: a member is not a JSON object");
  MultiMember m;
  auto name = j.find("name");
  auto conn = j.find("connector");
  if (name == j.end() || !name->is_string() || conn == j.end() || !conn->is_object()) {
    return InvalidArgument("multi: a member needs a string 'name' and an object 'connector'");
  }
  m.name = name->get<std::string>();
  if (!ValidMemberName(m.name))
    return InvalidArgument("multi: invalid member name '" + m.name + "'");
  XSILO_ASSIGN_OR_RETURN(m.connector, ConnectorConfig::FromJson(conn->dump()));
  MultiPolicy& p = m.policy;
  for (const auto& item : j.items()) {
    const std::string& k = item.key();
    const json& v = item.value();
    if (k == "name" || k == "connector") continue;
    if (k == "min_size" || k == "max_size") {
      if (!v.is_number_unsigned()) return InvalidArgument("multi: " + k + " is not unsigned");
      (k == "min_size" ? p.min_size : p.max_size) = v.get<uint64_t>();
    } else if (k == "subset_tags") {
      XSILO_ASSIGN_OR_RETURN(p.subset_tags, TagSet(v, "subset_tags"));
    } else if (k == "superset_tags") {
      XSILO_ASSIGN_OR_RETURN(p.superset_tags, TagSet(v, "superset_tags"));
    } else if (k == "host_pattern") {
      if (!v.is_string()) return InvalidArgument("multi: host_pattern is not a string");
      p.host_pattern = v.get<std::string>();
    } else if (k == "priority") {
      if (!v.is_number_integer()) return InvalidArgument("multi: priority is not an integer");
      p.priority = v.get<int64_t>();
    } else {
      return InvalidArgument("multi: unknown member field '" + k + "'");
    }
  }
  if (p.min_size > p.max_size) {
    return InvalidArgument("multi: member '" + m.name + "' has min_size > max_size");
  }
  return m;
}

struct Member {
  MultiMember spec;
  std::unique_ptr<Connector> connector;  // null when dormant
  std::string dormant_reason;
};

class MultiConnector final : public Connector, public PlacementAwareConnector {
 public:
  MultiConnector(std::vector<Member> members, std::string host)
      : members_(std::move(members)), host_(std::move(host)) {
    std::vector<MultiMember> specs;
    for (const Member& m : members_) specs.push_back(m.spec);
    config_ = MultiConnectorConfig(specs);
    // Put order: priority, highest first; stable, so earlier members win ties.
    for (size_t i = 0; i < members_.size(); ++i) order_.push_back(i);
    std::stable_sort(order_.begin(), order_.end(), [&](size_t a, size_t b) {
      return members_[a].spec.policy.priority > members_[b].spec.policy.priority;
    });
  }

  std::string_view type() const override { return "multi"; }
  ConnectorConfig config() const override { return config_; }

  Result<Key> Put(const GatherList& bytes) override { return PutPlaced(bytes, {}); }

  Result<Key> PutPlaced(const GatherList& bytes, const PlacementHints& hints) override {
    XSILO_ASSIGN_OR_RETURN(Member * m, Choose(bytes.size, hints));
    XSILO_ASSIGN_OR_RETURN(Key inner, m->connector->Put(bytes));
    return Outer(m->spec.name, std::move(inner));
  }

  Result<std::optional<Buffer>> Get(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(auto routed, Route(key));
    return routed.first->connector->Get(routed.second);
  }

  Result<bool> Exists(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(auto routed, Route(key));
    return routed.first->connector->Exists(routed.second);
  }

  Status Evict(const Key& key) override {
    XSILO_ASSIGN_OR_RETURN(auto routed, Route(key));
    return routed.first->connector->Evict(routed.second);
  }

  Result<Key> NewKey() override {
    XSILO_ASSIGN_OR_RETURN(Member * m, Choose(std::nullopt, {}));
    XSILO_ASSIGN_OR_RETURN(Key inner, m->connector->NewKey());
    return Outer(m->spec.name, std::move(inner));
  }

  Status Set(const Key& key, const GatherList& bytes) override {
    XSILO_ASSIGN_OR_RETURN(auto routed, Route(key));
    return routed.first->connector->Set(routed.second, bytes);
  }

  void Close() override {
    for (Member& m : members_) {
      if (m.connector) m.connector->Close();
    }
  }

 private:
  Result<Member*> Choose(std::optional<uint64_t> size, const PlacementHints& hints) {
    for (size_t i : order_) {
      Member& m = members_[i];
      if (m.connector && m.spec.policy.Accepts(size, hints)) return &m;
    }
    std::string what = size ? "an object of " + std::to_string(*size) + " bytes" : "a deferred key";
    return FailedPrecondition("multi: no active member's policy accepts " + what + " on host '" +
                              host_ + "'");
  }

  Result<std::pair<Member*, Key>> Route(const Key& key) {
    if (key.connector != "multi") {
      return InvalidArgument("key of connector '" + key.connector + "' given to a multi connector");
    }
    XSILO_ASSIGN_OR_RETURN(auto inner, InnerKeyOf(key));
    for (Member& m : members_) {
      if (m.spec.name != inner.first) continue;
      if (!m.connector) {
        return FailedPrecondition("multi: key " + key.id + " lives in member '" + m.spec.name +
                                  "', which is dormant on host '" + host_ +
                                  "': " + m.dormant_reason);
      }
      return std::make_pair(&m, std::move(inner.second));
    }
    return InvalidArgument("multi: key " + key.id + " names member '" + inner.first +
                           "', which this connector does not have");
  }

  static Key Outer(const std::string& route, Key inner) {
    Key k{"multi", std::move(inner.id), inner.size, std::move(inner.attrs)};
    k.attrs[kRouteAttr] = route;
    k.attrs[kTypeAttr] = std::move(inner.connector);
    return k;
  }

  std::vector<Member> members_;
  std::vector<size_t> order_;
  const std::string host_;
  ConnectorConfig config_;
};

}  // namespace

bool MultiPolicy::Accepts(std::optional<uint64_t> size, const PlacementHints& hints) const {
  if (size && (*size < min_size || *size > max_size)) return false;
  if (!std::includes(subset_tags.begin(), subset_tags.end(), hints.subset_tags.begin(),
                     hints.subset_tags.end())) {
    return false;
  }
  if (!hints.superset_tags.empty() &&
      !std::includes(hints.superset_tags.begin(), hints.superset_tags.end(), superset_tags.begin(),
                     superset_tags.end())) {
    return false;
  }
  return true;
}

ConnectorConfig MultiConnectorConfig(const std::vector<MultiMember>& members) {
  json arr = json::array();
  for (const MultiMember& m : members) arr.push_back(MemberJson(m));
  return {"multi", {{"connectors", arr.dump()}}};
}

Result<std::vector<MultiMember>> ParseMultiMembers(
    const std::map<std::string, std::string>& options) {
  XSILO_RETURN_IF_ERROR(MultiConnectorOptionTable().CheckKeys(options));
  auto it = options.find("connectors");
  if (it == options.end()) return InvalidArgument("multi connector needs option 'connectors'");
  json arr = json::parse(it->second, nullptr, false);
  if (arr.is_discarded() || !arr.is_array()) {
    return InvalidArgument("multi: option 'connectors' is not a JSON array");
  }
  std::vector<MultiMember> members;
  std::set<std::string> names;
  for (const json& j : arr) {
    XSILO_ASSIGN_OR_RETURN(MultiMember m, MemberFrom(j));
    if (!names.insert(m.name).second) {
      return InvalidArgument("multi: member name '" + m.name + "' appears twice");
    }
    if (m.connector.type == "multi") return InvalidArgument("multi: members cannot be multi");
    members.push_back(std::move(m));
  }
  return members;
}

Result<std::pair<std::string, Key>> InnerKeyOf(const Key& multi_key) {
  auto route = multi_key.attrs.find(kRouteAttr);
  auto type = multi_key.attrs.find(kTypeAttr);
  if (route == multi_key.attrs.end() || type == multi_key.attrs.end()) {
    return InvalidArgument("multi key " + multi_key.id + " lacks attrs '" + kRouteAttr + "' and '" +
                           kTypeAttr + "'");
  }
  Key inner{type->second, multi_key.id, multi_key.size, multi_key.attrs};
  inner.attrs.erase(kRouteAttr);
  inner.attrs.erase(kTypeAttr);
  return std::make_pair(route->second, std::move(inner));
}

std::string MultiHostName() {
  if (const char* h = std::getenv("XSILO_HOSTNAME"); h && *h) return h;
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "localhost";
  return buf;
}

Result<std::unique_ptr<Connector>> MakeMultiConnector(const ConnectorOptions& options) {
  XSILO_ASSIGN_OR_RETURN(std::vector<MultiMember> specs, ParseMultiMembers(options));
  std::string host = MultiHostName();
  std::vector<Member> members;
  for (MultiMember& spec : specs) {
    Member m;
    if (!spec.policy.host_pattern.empty()) {
      std::regex re;
      try {
        re = std::regex(spec.policy.host_pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        return InvalidArgument("multi: member '" + spec.name + "' host_pattern '" +
                               spec.policy.host_pattern + "' is not a valid regex: " + e.what());
      }
      if (!std::regex_match(host, re)) {
        m.dormant_reason = "host pattern '" + spec.policy.host_pattern + "' does not match";
      }
    }
    if (m.dormant_reason.empty()) {
      auto c = MakeConnector(spec.connector);
      if (c.ok()) {
        m.connector = std::move(c).value();
      } else {
        m.dormant_reason = "its connector cannot be built here: " + c.status().ToString();
      }
    }
    m.spec = std::move(spec);
    members.push_back(std::move(m));
  }
  return std::unique_ptr<Connector>(std::make_unique<MultiConnector>(std::move(members), host));
}

}  // namespace xsilo
