#include "xsilo/store/connector.h"

#include <sys/random.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "store/builtin.h"
#include "xsilo/core/log.h"

namespace xsilo {

using nlohmann::json;

namespace {

Result<std::map<std::string, std::string>> StringMap(const json& j, const char* what) {
  std::map<std::string, std::string> out;
  if (!j.is_object()) return InvalidArgument(std::string(what) + " is not a JSON object");
  for (const auto& item : j.items()) {
    if (!item.value().is_string()) {
      return InvalidArgument(std::string(what) + " value for '" + item.key() + "' is not a string");
    }
    out[item.key()] = item.value().get<std::string>();
  }
  return out;
}

}  // namespace

std::string Key::ToJson() const {
  json j = {{"c", connector}, {"id", id}, {"size", size}};
  if (!attrs.empty()) j["attrs"] = attrs;
  return j.dump();
}

Result<Key> Key::FromJson(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object()) return InvalidArgument("key is not a JSON object");
  auto c = j.find("c");
  auto id = j.find("id");
  auto size = j.find("size");
  if (c == j.end() || !c->is_string() || id == j.end() || !id->is_string() || size == j.end() ||
      !size->is_number_unsigned()) {
    return InvalidArgument("key needs string 'c', string 'id' and unsigned 'size'");
  }
  Key k;
  k.connector = c->get<std::string>();
  k.id = id->get<std::string>();
  k.size = size->get<uint64_t>();
  if (auto a = j.find("attrs"); a != j.end()) {
    XSILO_ASSIGN_OR_RETURN(k.attrs, StringMap(*a, "key attrs"));
  }
  return k;
}

std::string ConnectorConfig::ToJson() const {
  return json{{"type", type}, {"options", options}}.dump();
}

Result<ConnectorConfig> ConnectorConfig::FromJson(std::string_view text) {
  json j = json::parse(text.begin(), text.end(), nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return InvalidArgument("connector config is not a JSON object");
  auto t = j.find("type");
  if (t == j.end() || !t->is_string())
    return InvalidArgument("connector config needs a string 'type'");
  ConnectorConfig c;
  c.type = t->get<std::string>();
  if (auto o = j.find("options"); o != j.end()) {
    XSILO_ASSIGN_OR_RETURN(c.options, StringMap(*o, "connector options"));
  }
  return c;
}

Result<Key> Connector::Put(const Buffer& bytes) {
  GatherList g;
  g.Append(bytes);
  return Put(g);
}

Result<std::vector<Key>> Connector::PutBatch(const std::vector<Buffer>& objects) {
  std::vector<Key> keys;
  keys.reserve(objects.size());
  for (const Buffer& b : objects) {
    auto k = Put(b);
    if (!k.ok()) {
      (void)EvictBatch(keys);  // all or nothing
      return k.status();
    }
    keys.push_back(std::move(k).value());
  }
  return keys;
}

Result<std::vector<std::optional<Buffer>>> Connector::GetBatch(const std::vector<Key>& keys) {
  std::vector<std::optional<Buffer>> out;
  out.reserve(keys.size());
  for (const Key& k : keys) {
    XSILO_ASSIGN_OR_RETURN(auto b, Get(k));
    out.push_back(std::move(b));
  }
  return out;
}

Status Connector::EvictBatch(const std::vector<Key>& keys) {
  Status first;
  for (const Key& k : keys) {
    Status s = Evict(k);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

Status ErrnoStatus(const std::string& what, int e) {
  std::string msg = what + ": " + std::strerror(e);
  if (e == ENOENT) return NotFound(msg);
  if (e == EACCES || e == EPERM) return PermissionDenied(msg);
  if (e == ENOSPC || e == EDQUOT) return ResourceExhausted(msg);
  return Internal(msg);
}

std::string RandomObjectId() {
  // The kernel's CSPRNG, read afresh for every id: ids and the embedded
  // store's credentials (which are minted here too) are not predictable
  // from ids already seen, and nothing is buffered that a forked child
  // could hand out again.
  uint8_t bytes[16];
  size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = ::getrandom(bytes + got, sizeof bytes - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      static constinit LogComponent log("store");
      XSILO_LOG(log, kError, "getrandom failed: " << std::strerror(errno));
      std::abort();  // never hand out an id or a secret that is not random
    }
    got += static_cast<size_t>(n);
  }
  static const char* hex = "0123456789abcdef";
  std::string id(32, '0');
  for (size_t i = 0; i < sizeof bytes; ++i) {
    id[2 * i] = hex[bytes[i] >> 4];
    id[2 * i + 1] = hex[bytes[i] & 15];
  }
  return id;
}

}  // namespace xsilo
