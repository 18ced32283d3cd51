// Figures from a results directory: scripts/plot_e2e.py for `bench e2e`
// results (e2e.json), scripts/plot_p2p.py otherwise.
#pragma once

#include <string>

namespace xsilo::bench {

// Runs the plot script (XSILO_PLOT_SCRIPT, else the source tree's, else one
// next to this executable) with a python3 that has matplotlib (Debian's
// /usr/bin/python3 first). Returns the script's exit status, 1 when it
// cannot run.
int RunPlot(const std::string& dir);

}  // namespace xsilo::bench
