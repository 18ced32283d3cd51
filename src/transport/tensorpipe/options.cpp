#include "transport/tensorpipe/options.h"

#include "transport/builtin.h"

#include <charconv>
#include <sstream>
#include <vector>

namespace xsilo {

const OptionTable& TensorPipeOptionTable() {
  using T = OptionType;
  static const OptionTable table(
      "tensorpipe",
      {
          {"transports", T::kEnum, "uv", 0, 0, "uv|uv,shm|shm,uv",
           "uv: TCP; uv,shm (or shm,uv): also shared memory between peers on one host"},
          {"channels", T::kString, "basic", 0, 0, "",
           "comma-separated extra channels: cma, xth (basic is always on; mpt follows lanes)"},
          {"lanes", T::kInt, "1", 1, 64, "",
           "1: the basic channel only; N > 1: the mpt channel with N parallel uv connections"},
          {"lane_host", T::kString, "", 0, 0, "",
           "IP the mpt lanes listen on; empty: the server's host, 127.0.0.1 or this host's"},
          {"piece_bytes", T::kBytes, "1073741824", 1 << 20, int64_t{1} << 40, "",
           "largest TensorPipe tensor on the wire; a bigger tensor travels as several pieces"},
          {"verify_checksum", T::kFlag, "1", 0, 0, "",
           "the sender sends an XXH3-64 per tensor and the receiver verifies it"},
      });
  return table;
}

namespace tplink {

namespace {

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
  const OptionTable& table = TensorPipeOptionTable();
  const OptionMap& b = o.backend;
  XSILO_RETURN_IF_ERROR(table.CheckKeys(b));
  TensorPipeOptions t;
  const Result<std::string> transports = table.Enum(b, "transports");
  if (!transports.ok()) return transports.status();
  t.shm = transports->find("shm") != std::string::npos;
  for (const auto& c : SplitList(table.String(b, "channels"))) {
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
  XSILO_ASSIGN_OR_RETURN(int64_t lanes, table.Int(b, "lanes"));
  t.lanes = static_cast<int>(lanes);
  t.lane_host = table.String(b, "lane_host");
  XSILO_ASSIGN_OR_RETURN(int64_t piece, table.Int(b, "piece_bytes"));
  t.piece_bytes = static_cast<uint64_t>(piece);
  XSILO_ASSIGN_OR_RETURN(t.verify_checksum, table.Flag(b, "verify_checksum"));

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

}  // namespace tplink
}  // namespace xsilo
