// `xsilo fl run|server`'s report: the round table on stdout and the JSON
// of --json (docs/fl.md). Included by cmd_fl.cpp only.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "xsilo/core/status.h"
#include "xsilo/fl/fedavg.h"
#include "xsilo/fl/mlp.h"
#include "xsilo/transport/transport.h"

namespace xsilo::cli {

// Bytes as "12.3 MB".
std::string Mb(uint64_t bytes);

void PrintRoundHeader();
// loss / accuracy: the global model this round started from, evaluated by
// the clients on their held-out data.
void PrintRound(const fl::RoundReport& r, uint64_t rounds);
void PrintFinal(const fl::FinalEvaluation& f, int clients);

nlohmann::json JobJson(const std::string& transport, const std::string& tier,
                       const fl::MlpShape& shape, const fl::JobReport& job,
                       const std::vector<fl::PartyTimes>& times);
Status WriteJson(const std::string& path, const nlohmann::json& j);

// What the compressing decorator did, when `t` is one (compression=...):
// a line on stdout and an object for the JSON report; null otherwise.
nlohmann::json ReportCompression(const Transport& t, const std::string& party);

}  // namespace xsilo::cli
