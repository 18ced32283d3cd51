// Each subcommand of the xsilo CLI lives in its own file and adds itself here.
#pragma once

namespace CLI {
class App;
}

namespace xsilo::cli {

// Blocks until SIGINT or SIGTERM arrives (the server commands' main loop);
// the signals are blocked first, so no handler is needed (cmd_s3d.cpp).
void WaitForTermination();

void AddVersionCommand(CLI::App& app);
void AddBackendsCommand(CLI::App& app);  // `xsilo backends [--keys [--markdown]]`
void AddInspectCommand(CLI::App& app);
void AddRunCommand(CLI::App& app);
void AddS3dCommand(CLI::App& app);
void AddEndpointCommand(CLI::App& app);  // `xsilo endpoint start|status`
void AddRelayCommand(CLI::App& app);
void AddTlsCommand(CLI::App& app);
void AddNetemCommand(CLI::App& app);
void AddFlCommand(CLI::App& app);
void AddBenchCommand(CLI::App& app);
void AddBenchE2eCommand(CLI::App* bench);  // under `xsilo bench`

}  // namespace xsilo::cli
