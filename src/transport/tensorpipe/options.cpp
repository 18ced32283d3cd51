#include "transport/tensorpipe/options.h"

#include <charconv>
#include <sstream>
#include <vector>

namespace xsilo::tplink {

namespace {

Result<int64_t> Ranged(const TransportOptions& o, const std::string& key, int64_t fallback,
                       int64_t lo, int64_t hi) {
  XSILO_ASSIGN_OR_RETURN(int64_t v, BackendInt(o, key, fallback));
  if (v < lo || v > hi) {
    return InvalidArgument("tensorpipe option " + key + "=" + std::to_string(v) + " outside [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}

std::vector<std::string> SplitList(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

}  // namespace

Result<TensorPipeOptions> ParseTensorPipeOptions(const TransportOptions& o) {
  XSILO_RETURN_IF_ERROR(CheckBackendKeys(
      o, {"transports", "channels", "lanes", "lane_host", "piece_bytes", "verify_checksum"}));
  TensorPipeOptions t;
  const std::string transports = BackendString(o, "transports", "uv");
  if (transports == "uv,shm" || transports == "shm,uv") {
    t.shm = true;
  } else if (transports != "uv") {
    return InvalidArgument("tensorpipe option transports='" + transports +
                           "' (expected uv or uv,shm)");
  }
  for (const auto& c : SplitList(BackendString(o, "channels", "basic"))) {
    if (c == "basic" || c == "mpt") continue;  // basic always; mpt follows lanes
    if (c == "cma") {
      t.cma = true;
    } else if (c == "xth") {
      t.xth = true;
    } else {
      return InvalidArgument("tensorpipe option channels: unknown channel '" + c +
                             "' (known: basic, mpt, cma, xth)");
    }
  }
  XSILO_ASSIGN_OR_RETURN(int64_t lanes, Ranged(o, "lanes", 1, 1, 64));
  t.lanes = static_cast<int>(lanes);
  t.lane_host = BackendString(o, "lane_host", "");
  XSILO_ASSIGN_OR_RETURN(int64_t piece, Ranged(o, "piece_bytes", int64_t{1} << 30, int64_t{1} << 20,
                                               int64_t{1} << 40));
  t.piece_bytes = static_cast<uint64_t>(piece);
  XSILO_ASSIGN_OR_RETURN(int64_t verify, Ranged(o, "verify_checksum", 1, 0, 1));
  t.verify_checksum = verify != 0;

  const auto colon = o.address.rfind(':');
  if (o.address.empty() || colon == std::string::npos || colon == 0) {
    return InvalidArgument("tensorpipe transport needs options.address host:port, got '" +
                           o.address + "'");
  }
  t.host = o.address.substr(0, colon);
  if (t.host == "localhost") t.host = "127.0.0.1";
  const std::string port = o.address.substr(colon + 1);
  auto [ptr, ec] = std::from_chars(port.data(), port.data() + port.size(), t.port);
  if (ec != std::errc() || ptr != port.data() + port.size() || t.port <= 0 || t.port > 65535) {
    return InvalidArgument("tensorpipe options.address '" + o.address + "': bad port");
  }
  return t;
}

}  // namespace xsilo::tplink
