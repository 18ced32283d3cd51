// The files and the summary table of `bench p2p`, from its report: the JSON
// document whose "runs", "links" and "not_run" arrays RunP2p fills.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace xsilo::bench {

// Writes p2p.json, p2p.csv, dispatch.csv and links.csv to directory `dir`.
void WriteP2pFiles(const nlohmann::json& report, const std::string& dir);

// Prints one row per run, the runs not run and the senders' dispatch peaks.
void PrintP2pSummary(const nlohmann::json& report);

}  // namespace xsilo::bench
