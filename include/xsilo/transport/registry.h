// Transports register by name with a viability check, so callers pick a
// backend from configuration ("inproc", "grpc", "mpi-buffer", ...).
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xsilo/core/option_table.h"
#include "xsilo/transport/transport.h"

namespace xsilo {

struct TransportFactory {
  std::string name;
  std::string description;
  // OK when the backend can run in this process; otherwise says why not
  // (e.g. "not launched under mpirun").
  std::function<Status()> viable;
  std::function<Result<std::unique_ptr<Transport>>(const TransportOptions&)> create;
  // Every key of TransportOptions::backend the backend reads (its factory
  // parses them through this table); null: it reads none.
  const OptionTable* options = nullptr;
};

// Every key the transport layer reads, one table per owner: grpc (and
// auto), tensorpipe (in every build), inproc, mpi, compression (any
// backend), faulty (fault.*). The hybrid's are HybridOptionTable()
// (xsilo/hybrid/hybrid.h). `xsilo backends --keys` prints them all.
std::vector<const OptionTable*> BackendOptionTables();

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

  // `options`: the keys the composite reads itself (the hybrid's; store.*
  // keys are its connector's).
  void SetCompositeFactory(CompositeFactory factory, std::vector<std::string> connector_types,
                           const OptionTable* options = nullptr);

 private:
  const TransportFactory* Find(const std::string& name) const;  // caller holds mu_
  // A registered name, a composite, or "faulty(<known name>)".
  bool Known(const std::string& name) const;  // caller holds mu_
  // Splits "grpc+s3" (or "faulty(grpc)+s3") into a base transport and a
  // connector type.
  bool SplitComposite(const std::string& name, std::string* base, std::string* connector) const;
  // InvalidArgument for a key of options.backend that no layer of `name`
  // reads: one another layer reads names that layer, else the nearest key
  // of `name`'s layers. Caller holds mu_.
  Status CheckKeysFor(const std::string& name, const TransportOptions& options) const;

  mutable std::mutex mu_;
  std::vector<TransportFactory> factories_;
  CompositeFactory composite_;
  std::vector<std::string> connector_types_;
  const OptionTable* composite_options_ = nullptr;
};

}  // namespace xsilo
