#include "xsilo/bench/plot.h"

#include <spawn.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <vector>

extern char** environ;

#ifndef XSILO_SOURCE_DIR
#define XSILO_SOURCE_DIR ""
#endif

namespace xsilo::bench {

namespace fs = std::filesystem;

int RunPlot(const std::string& dir) {
  std::string script;
  if (const char* s = std::getenv("XSILO_PLOT_SCRIPT")) script = s;
  std::error_code ec;
  // e2e results (e2e.json) get Figure 5; p2p results Figures 2 and 4.
  const std::string name =
      fs::exists(fs::path(dir) / "e2e.json", ec) ? "plot_e2e.py" : "plot_p2p.py";
  const std::vector<std::string> candidates = {
      script, std::string(XSILO_SOURCE_DIR) + "/scripts/" + name,
      (fs::read_symlink("/proc/self/exe", ec).parent_path() / name).string()};
  script.clear();
  for (const auto& c : candidates) {
    if (!c.empty() && fs::exists(c, ec)) {
      script = c;
      break;
    }
  }
  if (script.empty()) {
    std::cerr << "xsilo bench plot: scripts/plot_p2p.py not found (set XSILO_PLOT_SCRIPT)\n";
    return 1;
  }
  const std::string python = fs::exists("/usr/bin/python3", ec) ? "/usr/bin/python3" : "python3";
  std::vector<std::string> args = {python, script, "--in", dir};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawnp(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    std::cerr << "xsilo bench plot: cannot run " << python << "\n";
    return 1;
  }
  int st = 0;
  waitpid(pid, &st, 0);
  return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}

}  // namespace xsilo::bench
