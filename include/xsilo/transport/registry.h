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

class TransportRegistry {
 public:
  // The process-wide registry, with every built-in backend registered.
  static TransportRegistry& Global();

  Status Register(TransportFactory factory);
  // NotFound for an unknown name, the viability Status for an unusable one.
  Result<std::unique_ptr<Transport>> Create(const std::string& name,
                                            const TransportOptions& options) const;
  Status Viable(const std::string& name) const;
  std::vector<std::string> Names() const;
  std::string Description(const std::string& name) const;

 private:
  mutable std::mutex mu_;
  std::vector<TransportFactory> factories_;
};

}  // namespace xsilo
