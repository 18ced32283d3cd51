#include "bench/p2p_output.h"

#include <algorithm>
#include <fstream>
#include <iomanip>
#include <iostream>

#include "xsilo/bench/report.h"

namespace xsilo::bench {

using nlohmann::json;

void WriteP2pFiles(const json& report, const std::string& dir) {
  {
    std::ofstream out(dir + "/p2p.json");
    out << report.dump(1) << "\n";
  }
  {
    std::ofstream csv(dir + "/p2p.csv");
    csv << "env,tier,backend,bytes,latency_median_ms,latency_p95_ms,floor_ms,over_floor,"
           "speedup,sequential_s,concurrent_s,broadcast_peers,broadcast_peak_bytes,"
           "broadcast_rss_before_bytes,encode_ms,decode_ms,serialization_share,error,"
           "delivery_median_ms,delivery_over_floor\n";
    for (const auto& r : report["runs"]) {
      auto num = [&](const json& j, const char* k) {
        return j.contains(k) ? j[k].dump() : std::string();
      };
      json c = r.value("concurrency", json::object());
      json bc = r.value("broadcast", json::object());
      csv << r["env"].get<std::string>() << "," << r["tier"].get<std::string>() << ","
          << r["backend"].get<std::string>() << "," << r["bytes"] << ","
          << num(r, "latency_median_ms") << "," << num(r, "latency_p95_ms") << ","
          << num(r, "floor_ms") << "," << num(r, "over_floor") << "," << num(c, "speedup") << ","
          << num(c, "sequential_s") << "," << num(c, "concurrent_s") << "," << num(bc, "peers")
          << "," << num(bc, "peak_bytes") << "," << num(bc, "rss_before_bytes") << ","
          << num(r, "encode_ms") << "," << num(r, "decode_ms") << ","
          << num(r, "serialization_share") << "," << (r.contains("error") ? "failed" : "") << ","
          << num(r, "delivery_median_ms") << "," << num(r, "delivery_over_floor") << "\n";
    }
  }
  {
    std::ofstream csv(dir + "/dispatch.csv");
    csv << "env,tier,backend,n,seconds,rss_before_bytes,peak_bytes,helpers_peak_bytes\n";
    for (const auto& r : report["runs"]) {
      for (const auto& d : r.value("dispatch", json::array())) {
        csv << r["env"].get<std::string>() << "," << r["tier"].get<std::string>() << ","
            << r["backend"].get<std::string>() << "," << d["n"] << "," << d["seconds"] << ","
            << d["rss_before_bytes"] << "," << d["peak_bytes"] << "," << d["helpers_peak_bytes"]
            << "\n";
      }
    }
  }
  {
    std::ofstream csv(dir + "/links.csv");
    csv << "env,scale,rtt_ms,single_MBps,multi_MBps,streams,target_rtt_ms,target_single_MBps,"
           "target_multi_MBps\n";
    for (const auto& l : report["links"]) {
      csv << l["env"].get<std::string>() << "," << l["scale"] << "," << l["rtt_ms"] << ","
          << l["single_MBps"] << "," << l["multi_MBps"] << "," << l["streams"] << ","
          << l["target_rtt_ms"] << "," << l["target_single_MBps"] << "," << l["target_multi_MBps"]
          << "\n";
    }
  }
}

void PrintP2pSummary(const json& report) {
  // The backend column fits the longest name (grpc+endpoint-relayed).
  int name_w = 12;
  for (const auto& r : report["runs"])
    name_w = std::max(name_w, static_cast<int>(r["backend"].get<std::string>().size()) + 1);
  std::cout << "\n"
            << std::left << std::setw(13) << "env" << std::setw(8) << "tier" << std::setw(name_w)
            << "backend" << std::right << std::setw(12) << "median ms" << std::setw(10) << "p95 ms"
            << std::setw(11) << "floor ms" << std::setw(8) << "/floor" << std::setw(9) << "speedup"
            << std::setw(12) << "bcast MB" << std::setw(8) << "codec"
            << "\n";
  for (const auto& r : report["runs"]) {
    std::cout << std::left << std::setw(13) << r["env"].get<std::string>() << std::setw(8)
              << r["tier"].get<std::string>() << std::setw(name_w)
              << r["backend"].get<std::string>() << std::right;
    if (r.contains("error")) {
      std::cout << "  FAILED: " << r["error"].get<std::string>() << "\n";
      continue;
    }
    auto cell = [&](bool has, double v, int w, int d) {
      std::cout << std::setw(w) << (has ? Fixed(v, d) : std::string("-"));
    };
    cell(true, r["latency_median_ms"], 12, 1);
    cell(true, r["latency_p95_ms"], 10, 1);
    cell(r.contains("floor_ms"), r.value("floor_ms", 0.0), 11, 1);
    cell(r.contains("over_floor"), r.value("over_floor", 0.0), 8, 2);
    cell(r.contains("concurrency"),
         r.contains("concurrency") ? r["concurrency"]["speedup"].get<double>() : 0, 9, 2);
    cell(r.contains("broadcast"),
         r.contains("broadcast") ? r["broadcast"]["peak_bytes"].get<double>() / 1e6 : 0, 12, 0);
    std::cout << std::setw(7) << Fixed(100 * r["serialization_share"].get<double>(), 0) << "%\n";
  }
  for (const auto& n : report["not_run"]) {
    std::cout << "not run: " << n.value("env", "") << " " << n.value("tier", "") << " "
              << n.value("backend", "") << ": " << n["reason"].get<std::string>() << "\n";
  }
  for (const auto& r : report["runs"]) {
    for (const auto& d : r.value("dispatch", json::array())) {
      std::cout << "dispatch " << r["env"].get<std::string>() << " " << r["tier"].get<std::string>()
                << " " << r["backend"].get<std::string>() << " n=" << d["n"] << ": sender peak "
                << Fixed(d["peak_bytes"].get<double>() / 1e6, 0) << " MB (before "
                << Fixed(d["rss_before_bytes"].get<double>() / 1e6, 0) << " MB)\n";
    }
  }
}

}  // namespace xsilo::bench
