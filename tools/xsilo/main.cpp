// xsilo: move large objects between the parties of federated applications.
#include <CLI/CLI.hpp>
#include <iostream>

#include "commands.h"
#include "xsilo/version.h"

int main(int argc, char** argv) {
  CLI::App app{"xsilo: move large objects between the parties of federated applications"};
  app.require_subcommand(1);
  app.set_version_flag("--version", std::string(xsilo::kVersion));
  xsilo::cli::AddVersionCommand(app);
  xsilo::cli::AddBackendsCommand(app);
  xsilo::cli::AddInspectCommand(app);
  xsilo::cli::AddRunCommand(app);
  xsilo::cli::AddS3dCommand(app);
  xsilo::cli::AddEndpointCommand(app);
  xsilo::cli::AddRelayCommand(app);
  xsilo::cli::AddTlsCommand(app);
  xsilo::cli::AddNetemCommand(app);
  xsilo::cli::AddFlCommand(app);
  xsilo::cli::AddBenchCommand(app);
  CLI11_PARSE(app, argc, argv);
  return 0;
}
