#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "xsilo/core/codec.h"
#include "xsilo/transport/registry.h"
#include "xsilo/version.h"

namespace xsilo::cli {

void AddVersionCommand(CLI::App& app) {
  auto* cmd = app.add_subcommand("version", "Print the version, wire format and transports");
  cmd->callback([] {
    std::cout << "xsilo " << kVersion << " (wire format v" << kWireVersion << ")\n";
    auto& reg = TransportRegistry::Global();
    std::cout << "transports:\n";
    for (const auto& name : reg.Names()) {
      Status viable = reg.Viable(name);
      std::cout << "  " << name << "  " << reg.Description(name)
                << (viable.ok() ? "" : "  [unavailable: " + viable.message() + "]") << "\n";
    }
  });
}

}  // namespace xsilo::cli
