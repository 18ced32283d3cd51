#include <algorithm>
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

}  // namespace xsilo
