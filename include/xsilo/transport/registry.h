// Transports register by name with a viability check, so callers pick a
// backend from configuration ("inproc", "grpc", "mpi-buffer", ...).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xsilo/transport/transport.h"

namespace xsilo {

struct TransportFactory {
  std::string name;
  std::string description;
  // OK when the backend can run in this process; otherwise says why not
  // (e.g. "not launched under mpirun").
  std::function<Status()> viable;
  std::function<Result<std::unique_ptr<Transport>>(const TransportOptions&)> create;
};

// Builds a composite backend "<transport>+<connector>" (pass by proxy). A
// higher layer (src/hybrid) installs it; the transport layer only routes.
using CompositeFactory = std::function<Result<std::unique_ptr<Transport>>(
    const std::string& transport, const std::string& connector, const TransportOptions& options)>;

class TransportRegistry {
 public:
  // The process-wide registry, with every built-in backend registered.
  static TransportRegistry& Global();

  Status Register(TransportFactory factory);
  // NotFound for an unknown name, the viability Status for an unusable one.
  // "faulty(<name>)" wraps <name> in the fault-injecting decorator
  // (docs/reliability.md), configured by the fault.* options.
  Result<std::unique_ptr<Transport>> Create(const std::string& name,
                                            const TransportOptions& options) const;
  Status Viable(const std::string& name) const;
  // Base names, then "<base>+<connector>" for every connector type of the
  // installed composite factory.
  std::vector<std::string> Names() const;
  std::string Description(const std::string& name) const;

  void SetCompositeFactory(CompositeFactory factory, std::vector<std::string> connector_types);

 private:
  const TransportFactory* Find(const std::string& name) const;  // caller holds mu_
  // A registered name, a composite, or "faulty(<known name>)".
  bool Known(const std::string& name) const;  // caller holds mu_
  // Splits "grpc+s3" (or "faulty(grpc)+s3") into a base transport and a
  // connector type.
  bool SplitComposite(const std::string& name, std::string* base, std::string* connector) const;

  mutable std::mutex mu_;
  std::vector<TransportFactory> factories_;
  CompositeFactory composite_;
  std::vector<std::string> connector_types_;
};

}  // namespace xsilo
