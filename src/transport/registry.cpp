#include "xsilo/transport/registry.h"

#include <algorithm>

#include "transport/builtin.h"

namespace xsilo {

TransportRegistry& TransportRegistry::Global() {
  static TransportRegistry* registry = [] {
    auto* r = new TransportRegistry();
    RegisterBuiltinTransports(*r);
    return r;
  }();
  return *registry;
}

Status TransportRegistry::Register(TransportFactory factory) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : factories_) {
    if (f.name == factory.name)
      return AlreadyExists("transport '" + factory.name + "' registered twice");
  }
  factories_.push_back(std::move(factory));
  return Status::OK();
}

Result<std::unique_ptr<Transport>> TransportRegistry::Create(
    const std::string& name, const TransportOptions& options) const {
  TransportFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find_if(factories_.begin(), factories_.end(),
                           [&](const TransportFactory& f) { return f.name == name; });
    if (it == factories_.end()) {
      std::string known;
      for (const auto& f : factories_) known += (known.empty() ? "" : ", ") + f.name;
      return NotFound("no transport named '" + name + "' (available: " + known + ")");
    }
    factory = *it;
  }
  if (factory.viable) {
    Status v = factory.viable();
    if (!v.ok()) return v.WithContext("transport '" + name + "' is not usable here");
  }
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument("rank " + std::to_string(options.rank) + " outside world of " +
                           std::to_string(options.world_size));
  }
  return factory.create(options);
}

Status TransportRegistry::Viable(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : factories_) {
    if (f.name == name) return f.viable ? f.viable() : Status::OK();
  }
  return NotFound("no transport named '" + name + "'");
}

std::vector<std::string> TransportRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& f : factories_) names.push_back(f.name);
  return names;
}

std::string TransportRegistry::Description(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& f : factories_) {
    if (f.name == name) return f.description;
  }
  return {};
}

}  // namespace xsilo
