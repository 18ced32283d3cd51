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
  if (Find(factory.name) != nullptr) {
    return AlreadyExists("transport '" + factory.name + "' registered twice");
  }
  factories_.push_back(std::move(factory));
  return Status::OK();
}

const TransportFactory* TransportRegistry::Find(const std::string& name) const {
  auto it = std::find_if(factories_.begin(), factories_.end(),
                         [&](const TransportFactory& f) { return f.name == name; });
  return it == factories_.end() ? nullptr : &*it;
}

bool TransportRegistry::SplitComposite(const std::string& name, std::string* base,
                                       std::string* connector) const {
  auto plus = name.rfind('+');
  if (plus == std::string::npos || !composite_) return false;
  *base = name.substr(0, plus);
  *connector = name.substr(plus + 1);
  return Find(*base) != nullptr && std::find(connector_types_.begin(), connector_types_.end(),
                                             *connector) != connector_types_.end();
}

Result<std::unique_ptr<Transport>> TransportRegistry::Create(
    const std::string& name, const TransportOptions& options) const {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument("rank " + std::to_string(options.rank) + " outside world of " +
                           std::to_string(options.world_size));
  }
  TransportFactory factory;
  CompositeFactory composite;
  std::string base, connector;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (const TransportFactory* f = Find(name)) {
      factory = *f;
    } else if (SplitComposite(name, &base, &connector)) {
      composite = composite_;
    } else {
      std::string known;
      for (const auto& f : factories_) known += (known.empty() ? "" : ", ") + f.name;
      std::string hint = composite_ ? " or <transport>+<connector>" : "";
      return NotFound("no transport named '" + name + "' (available: " + known + hint + ")");
    }
  }
  if (composite) {
    XSILO_RETURN_IF_ERROR(Viable(base).WithContext("transport '" + name + "' is not usable here"));
    return composite(base, connector, options);
  }
  if (factory.viable) {
    Status v = factory.viable();
    if (!v.ok()) return v.WithContext("transport '" + name + "' is not usable here");
  }
  return factory.create(options);
}

Status TransportRegistry::Viable(const std::string& name) const {
  TransportFactory factory;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::string base, connector;
    const TransportFactory* f = Find(name);
    if (f == nullptr && SplitComposite(name, &base, &connector)) f = Find(base);
    if (f == nullptr) return NotFound("no transport named '" + name + "'");
    factory = *f;
  }
  return factory.viable ? factory.viable() : Status::OK();
}

std::vector<std::string> TransportRegistry::Names() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<std::string> names;
  for (const auto& f : factories_) names.push_back(f.name);
  if (composite_) {
    for (const auto& f : factories_) {
      for (const auto& c : connector_types_) names.push_back(f.name + "+" + c);
    }
  }
  return names;
}

std::string TransportRegistry::Description(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (const TransportFactory* f = Find(name)) return f->description;
  std::string base, connector;
  if (SplitComposite(name, &base, &connector)) {
    return base + " control plane; tensors above the threshold travel through the " + connector +
           " connector";
  }
  return {};
}

void TransportRegistry::SetCompositeFactory(CompositeFactory factory,
                                            std::vector<std::string> connector_types) {
  std::lock_guard<std::mutex> lock(mu_);
  composite_ = std::move(factory);
  connector_types_ = std::move(connector_types);
}

}  // namespace xsilo
