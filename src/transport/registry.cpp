#include "xsilo/transport/registry.h"

#include <algorithm>

#include "transport/builtin.h"
#include "xsilo/transport/compression.h"

namespace xsilo {

namespace {

// "faulty(<inner>)" -> true and *inner.
bool Decorated(const std::string& name, std::string* inner) {
  static const std::string kPrefix = "faulty(";
  if (name.size() <= kPrefix.size() + 1 || name.compare(0, kPrefix.size(), kPrefix) != 0 ||
      name.back() != ')') {
    return false;
  }
  *inner = name.substr(kPrefix.size(), name.size() - kPrefix.size() - 1);
  return true;
}

}  // namespace

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

bool TransportRegistry::Known(const std::string& name) const {
  std::string inner, base, connector;
  if (Find(name) != nullptr) return true;
  if (Decorated(name, &inner)) return Known(inner);
  return SplitComposite(name, &base, &connector);
}

bool TransportRegistry::SplitComposite(const std::string& name, std::string* base,
                                       std::string* connector) const {
  auto plus = name.rfind('+');
  if (plus == std::string::npos || !composite_ || name.back() == ')') return false;
  *base = name.substr(0, plus);
  *connector = name.substr(plus + 1);
  std::string inner;
  const bool base_known = Find(*base) != nullptr || (Decorated(*base, &inner) && Known(inner));
  return base_known && std::find(connector_types_.begin(), connector_types_.end(), *connector) !=
                           connector_types_.end();
}

Result<std::unique_ptr<Transport>> TransportRegistry::Create(
    const std::string& name, const TransportOptions& options) const {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size) {
    return InvalidArgument("rank " + std::to_string(options.rank) + " outside world of " +
                           std::to_string(options.world_size));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Known(name)) XSILO_RETURN_IF_ERROR(CheckKeysFor(name, options));
  }
  // compression* options wrap the whole backend (faults, when asked for,
  // then strike compressed frames).
  {
    CompressionPolicy policy;
    TransportOptions rest;
    XSILO_ASSIGN_OR_RETURN(bool compress, ParseCompressionOptions(options, &policy, &rest));
    if (rest.backend.size() != options.backend.size()) {
      XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, Create(name, rest));
      if (!compress) return t;
      return MakeCompressingTransport(std::move(t), std::move(policy));
    }
  }
  std::string inner;
  if (Decorated(name, &inner)) {
    // fault.* options configure the decorator; the rest are the inner one's.
    TransportOptions own = options, wrapped = options;
    own.backend.clear();
    wrapped.backend.clear();
    for (const auto& [k, v] : options.backend) {
      (k.rfind("fault.", 0) == 0 ? own : wrapped).backend[k] = v;
    }
    XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Transport> t, Create(inner, wrapped));
    return MakeFaultyTransport(std::move(t), own);
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
      std::string hint = composite_ ? ", <transport>+<connector>" : "";
      hint += " or faulty(<transport>)";
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
  std::string inner;
  if (Decorated(name, &inner)) return Viable(inner);
  TransportFactory factory;
  std::string base, connector;
  {
    std::lock_guard<std::mutex> lock(mu_);
    const TransportFactory* f = Find(name);
    if (f == nullptr && SplitComposite(name, &base, &connector)) {
      f = Find(base);
      if (f == nullptr) inner = base;  // a decorated base: "faulty(grpc)+s3"
    }
    if (f == nullptr && inner.empty()) return NotFound("no transport named '" + name + "'");
    if (f != nullptr) factory = *f;
  }
  if (!inner.empty()) return Viable(inner);
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
  std::string base, connector, inner;
  if (Decorated(name, &inner)) {
    return "fault injection (fault.* options) around " + inner;
  }
  if (SplitComposite(name, &base, &connector)) {
    return base + " control plane; tensors above the threshold travel through the " + connector +
           " connector";
  }
  return {};
}

void TransportRegistry::SetCompositeFactory(CompositeFactory factory,
                                            std::vector<std::string> connector_types,
                                            const OptionTable* options) {
  std::lock_guard<std::mutex> lock(mu_);
  composite_ = std::move(factory);
  connector_types_ = std::move(connector_types);
  composite_options_ = options;
}

Status TransportRegistry::CheckKeysFor(const std::string& name,
                                       const TransportOptions& options) const {
  // The layers of `name`: faulty(...), <base>+<connector>, the base.
  std::string base = name, inner, split, connector;
  bool faulty = false, composite = false;
  for (bool peeled = true; peeled;) {
    peeled = false;
    if (Decorated(base, &inner)) {
      faulty = peeled = true;
      base = inner;
    } else if (SplitComposite(base, &split, &connector)) {
      composite = peeled = true;
      base = split;
    }
  }
  const TransportFactory* f = Find(base);
  const OptionTable* own = f != nullptr ? f->options : nullptr;
  const OptionTable& compression = CompressionOptionTable();
  const OptionTable& fault = FaultOptionTable();
  for (const auto& [k, v] : options.backend) {
    if (compression.Find(k) != nullptr) continue;
    if (fault.Find(k) != nullptr) {
      if (faulty) continue;
      return InvalidArgument("backend option '" + k + "' is fault injection's: it needs " +
                             "faulty(<transport>), and '" + name + "' has none");
    }
    if (k.rfind("store.", 0) == 0 || (composite_options_ && composite_options_->Find(k))) {
      if (composite) continue;  // the composite and its connector check these
      if (own == nullptr || own->Find(k) == nullptr) {
        return InvalidArgument("backend option '" + k + "' is the " +
                               (k.rfind("store.", 0) == 0 ? "connector's" : "hybrid's") +
                               " of <transport>+<connector> backends, and '" + name +
                               "' has no connector");
      }
    }
    if (own != nullptr && own->Find(k) != nullptr) continue;
    for (const auto& other : factories_) {
      if (other.options != nullptr && other.options != own && other.options->Find(k)) {
        return InvalidArgument("backend option '" + k + "' is " + other.options->owner() +
                               "'s, not " + base + "'s");
      }
    }
    // A key of no layer: the nearest of those `name` takes.
    std::vector<std::string> known;
    std::vector<const OptionTable*> tables = {own, &compression};
    if (faulty) tables.push_back(&fault);
    if (composite) tables.push_back(composite_options_);
    for (const OptionTable* t : tables) {
      if (t == nullptr) continue;
      for (const auto& row : t->rows()) known.emplace_back(row.name);
    }
    std::string list;
    for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
    const std::string nearest = NearestName(k, known);
    return InvalidArgument("unknown backend option '" + k + "' of " + name +
                           (nearest.empty() ? "" : " (did you mean '" + nearest + "'?)") +
                           " (known: " + list + (composite ? ", store.<connector key>" : "") + ")");
  }
  return Status::OK();
}

}  // namespace xsilo
