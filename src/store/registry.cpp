#include <algorithm>
#include <charconv>
#include <functional>
#include <utility>
#include <vector>

#include "store/builtin.h"

namespace xsilo {

namespace {

using Factory = std::function<Result<std::unique_ptr<Connector>>(const ConnectorOptions&)>;

const std::vector<std::pair<std::string, Factory>>& Factories() {
  static const std::vector<std::pair<std::string, Factory>> factories = {
      {"memory", MakeMemoryConnector},     {"file", MakeFileConnector},
      {"redis", MakeRedisConnector},       {"s3", MakeS3Connector},
      {"endpoint", MakeEndpointConnector}, {"zmq", MakeZmqConnector},
      {"multi", MakeMultiConnector},       {"faulty", MakeFaultyConnector},
#ifdef XSILO_HAVE_UCX
      {"ucx", MakeUcxConnector},
#endif
  };
  return factories;
}

}  // namespace

Result<std::unique_ptr<Connector>> MakeConnector(const ConnectorConfig& config) {
  for (const auto& [type, factory] : Factories()) {
    if (type == config.type) return factory(config.options);
  }
  std::string known;
  for (const auto& [type, f] : Factories()) known += (known.empty() ? "" : ", ") + type;
  return NotFound("no connector type '" + config.type + "' (available: " + known + ")");
}

std::vector<std::string> ConnectorTypes() {
  std::vector<std::string> types;
  for (const auto& [type, f] : Factories()) types.push_back(type);
  return types;
}

Status CheckConnectorOptions(const std::string& type, const ConnectorOptions& options,
                             std::initializer_list<const char*> known) {
  for (const auto& option : options) {
    const std::string& k = option.first;
    if (std::none_of(known.begin(), known.end(), [&](const char* n) { return k == n; })) {
      return InvalidArgument("unknown option '" + k + "' for connector '" + type + "'");
    }
  }
  return Status::OK();
}

Result<int64_t> ConnectorIntOption(const std::string& type, const ConnectorOptions& options,
                                   const char* key, int64_t fallback, int64_t min, int64_t max) {
  auto it = options.find(key);
  if (it == options.end()) return fallback;
  int64_t v = 0;
  const std::string& text = it->second;
  auto [p, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  if (ec != std::errc() || p != text.data() + text.size() || v < min || v > max) {
    return InvalidArgument(type + " option " + key + "='" + text + "' must be an integer in [" +
                           std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return v;
}

}  // namespace xsilo
