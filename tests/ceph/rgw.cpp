#include "ceph/rgw.h"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <string_view>
#include <thread>

namespace xsilo::testing {

namespace {

constexpr const char* kVars[] = {"XSILO_RGW_ENDPOINT", "XSILO_RGW_ACCESS_KEY",
                                 "XSILO_RGW_SECRET_KEY", "XSILO_RGW_LOG", "XSILO_RGW_ADMIN_SOCKET"};

// The value of `export NAME=value` lines.
std::map<std::string, std::string> ReadEnvFile(std::ifstream& in) {
  std::map<std::string, std::string> out;
  for (std::string line; std::getline(in, line);) {
    constexpr std::string_view kExport = "export ";
    if (line.rfind(kExport, 0) == 0) line = line.substr(kExport.size());
    auto eq = line.find('=');
    if (eq != std::string::npos) out[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return out;
}

}  // namespace

Result<Rgw> FindRgw() {
  std::map<std::string, std::string> vars;
  std::string source = "the environment";
  if (const char* e = std::getenv("XSILO_RGW_ENDPOINT"); e != nullptr && *e != '\0') {
    for (const char* k : kVars) {
      if (const char* v = std::getenv(k)) vars[k] = v;
    }
  } else {
    const char* dir = std::getenv("XSILO_CEPH_DIR");
    source = std::string(dir != nullptr && *dir != '\0' ? dir : "/tmp/xsilo-ceph") + "/env";
    std::ifstream in(source);
    if (!in) {
      return FailedPrecondition(
          "no RADOS Gateway: XSILO_RGW_ENDPOINT is not set and " + source +
          " does not exist. `scripts/ceph-rgw.sh up` brings one up (under ctest, the fixture "
          "test ceph_rgw.up does, and its output says why it could not)");
    }
    vars = ReadEnvFile(in);
  }
  for (const char* k : kVars) {
    if (vars[k].empty()) return FailedPrecondition(std::string(k) + " is missing from " + source);
  }
  return Rgw{vars["XSILO_RGW_ENDPOINT"], vars["XSILO_RGW_ACCESS_KEY"], vars["XSILO_RGW_SECRET_KEY"],
             vars["XSILO_RGW_LOG"], vars["XSILO_RGW_ADMIN_SOCKET"]};
}

namespace {

PresignedRequests CountPresignedOnce(const Rgw& rgw, const std::string& bucket) {
  // Written by the gateway's log thread; a flush writes what it holds.
  const std::string flush =
      "ceph --admin-daemon '" + rgw.admin_socket + "' log flush >/dev/null 2>&1";
  [[maybe_unused]] int rc = std::system(flush.c_str());
  PresignedRequests n;
  std::ifstream in(rgw.log);
  // An access line: ... beast: 0x..: 127.0.0.1 - user [date] "PUT /b/k?q HTTP/1.1" 200 ...
  for (std::string line; std::getline(in, line);) {
    if (line.find(" beast: ") == std::string::npos) continue;
    auto open = line.find('"');
    auto close = open == std::string::npos ? open : line.find('"', open + 1);
    if (close == std::string::npos) continue;
    const std::string request = line.substr(open + 1, close - open - 1);
    const std::string status = line.substr(close + 2, 3);
    if (status.empty() || status[0] != '2') continue;
    auto space = request.find(' ');
    if (space == std::string::npos) continue;
    const std::string method = request.substr(0, space);
    const std::string target = request.substr(space + 1);
    if (target.rfind("/" + bucket + "/", 0) != 0) continue;
    if (target.find("X-Amz-Signature=") == std::string::npos) continue;
    if (method == "GET") ++n.gets;
    if (method == "PUT") ++n.puts;
    if (method == "PUT" && target.find("partNumber=") != std::string::npos) ++n.part_puts;
    if (method == "POST" && target.find("uploadId=") != std::string::npos) ++n.completions;
  }
  return n;
}

}  // namespace

PresignedRequests CountPresigned(const Rgw& rgw, const std::string& bucket, int completions) {
  // The gateway logs a request's access line just after its response: give
  // the last ones a moment to be written, never more than 10 s.
  PresignedRequests n = CountPresignedOnce(rgw, bucket);
  for (int i = 0; i < 100 && n.completions < completions; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    n = CountPresignedOnce(rgw, bucket);
  }
  return n;
}

std::string FreshBucket(const std::string& what) {
  static std::atomic<int> counter{0};
  return "xsilo-" + what + "-" + std::to_string(::getpid()) + "-" + std::to_string(counter++);
}

}  // namespace xsilo::testing
