// The compression and compression.* backend keys: their table and the
// parse into a CompressionPolicy (xsilo/transport/compression.h).
#include <map>
#include <string>
#include <string_view>

#include "xsilo/transport/compression.h"

namespace xsilo {

namespace {

constexpr std::string_view kPrefix = "compression.";

}  // namespace

const OptionTable& CompressionOptionTable() {
  using T = OptionType;
  static const OptionTable table(
      "compression",
      {
          {"compression", T::kString, "none", 0, 0, "",
           "codecs allowed: none, auto (= lossless zstd), lossless, bf16, fp16, int8, topk, "
           "CAST+topk; none: no decorator"},
          {"compression.when", T::kEnum, "auto", 0, 0, "auto|always",
           "auto: compress where the prediction says it pays; always: the strongest allowed "
           "codec every time"},
          {"compression.level", T::kInt, "1", 1, 19, "", "zstd level"},
          {"compression.threads", T::kInt, "0", 0, 64, "",
           "encode/decode threads per message; 0 = the CPUs this process may use, at most 4"},
          {"compression.int8_block", T::kInt, "256", 64, 4096, "",
           "values per int8 block; a power of two"},
          {"compression.min_tensor_bytes", T::kBytes, "65536", 0, int64_t{1} << 50, "",
           "smaller tensors travel as they are"},
          {"compression.min_message_bytes", T::kBytes, "1048576", 0, int64_t{1} << 50, "",
           "when=auto never compresses a smaller message"},
          {"compression.link_MBps", T::kReal, "0", 0, 0, "",
           "MB/s assumed before a peer's link is measured; 0: send as it is and measure"},
          {"compression.long_link_MBps", T::kReal, "600", 0, 0, "",
           "MB/s ceiling of an unmeasured link of RTT >= 20 ms; 0: unknown, sent as it is"},
          {"compression.topk_fraction", T::kFraction, "0.01", 1, 0, "",
           "fraction of an update's changes top-k keeps; only with topk or CAST+topk"},
          {"compression.stream", T::kFlag, "1", 0, 0, "",
           "hand a message still being encoded to a transport that streams sends (grant "
           "uploads)"},
      });
  return table;
}

Result<bool> ParseCompressionOptions(const TransportOptions& options, CompressionPolicy* policy,
                                     TransportOptions* rest) {
  *rest = options;
  rest->backend.clear();
  std::map<std::string, std::string> own;
  for (const auto& [k, v] : options.backend) {
    if (k == "compression" || k.rfind(kPrefix, 0) == 0) {
      own[k] = v;
    } else {
      rest->backend[k] = v;
    }
  }
  if (own.empty()) return false;
  CompressionPolicy p;
  std::string mode = own.count("compression") ? own["compression"] : "";
  if (mode.empty()) {
    return InvalidArgument(
        "compression.* options need compression=auto|lossless|bf16|fp16|int8|topk|CAST+topk");
  }
  bool topk = false;
  if (mode == "topk") {
    topk = true;
    mode = "lossless";
  } else if (mode.size() > 5 && mode.compare(mode.size() - 5, 5, "+topk") == 0) {
    topk = true;
    mode.resize(mode.size() - 5);
    if (mode != "bf16" && mode != "fp16" && mode != "int8") {
      return InvalidArgument("compression='" + own["compression"] +
                             "': top-k goes with bf16, fp16 or int8 (or alone: topk)");
    }
  }
  if (mode == "none") return false;
  if (mode == "auto" || mode == "lossless") {
    p.allowed = Quant::kNone;
  } else if (mode == "bf16") {
    p.allowed = Quant::kBF16;
  } else if (mode == "fp16") {
    p.allowed = Quant::kFP16;
  } else if (mode == "int8") {
    p.allowed = Quant::kInt8;
  } else {
    return InvalidArgument("compression='" + mode +
                           "' is none of none, auto, lossless, bf16, fp16, int8, topk, "
                           "bf16+topk, fp16+topk, int8+topk");
  }
  const OptionTable& t = CompressionOptionTable();
  XSILO_RETURN_IF_ERROR(t.CheckKeys(own));
  XSILO_ASSIGN_OR_RETURN(std::string when, t.Enum(own, "compression.when"));
  p.always = when == "always";
  XSILO_ASSIGN_OR_RETURN(p.stream, t.Flag(own, "compression.stream"));
  XSILO_ASSIGN_OR_RETURN(int64_t level, t.Int(own, "compression.level"));
  XSILO_ASSIGN_OR_RETURN(int64_t threads, t.Int(own, "compression.threads"));
  XSILO_ASSIGN_OR_RETURN(int64_t block, t.Int(own, "compression.int8_block"));
  XSILO_ASSIGN_OR_RETURN(int64_t min_tensor, t.Int(own, "compression.min_tensor_bytes"));
  XSILO_ASSIGN_OR_RETURN(int64_t min_message, t.Int(own, "compression.min_message_bytes"));
  XSILO_ASSIGN_OR_RETURN(double mbps, t.Real(own, "compression.link_MBps"));
  XSILO_ASSIGN_OR_RETURN(double long_mbps, t.Real(own, "compression.long_link_MBps"));
  XSILO_ASSIGN_OR_RETURN(double fraction, t.Real(own, "compression.topk_fraction"));
  if (own.count("compression.topk_fraction") && !topk) {
    return InvalidArgument("compression.topk_fraction needs compression=topk or CAST+topk");
  }
  const auto b = static_cast<uint32_t>(block);
  if ((b & (b - 1)) != 0) {
    return InvalidArgument("compression.int8_block must be a power of two in 64..4096");
  }
  p.codec.zstd_level = static_cast<int>(level);
  p.codec.threads = static_cast<int>(threads);
  p.codec.int8_block = b;
  p.codec.min_tensor_bytes = static_cast<uint64_t>(min_tensor);
  p.min_message_bytes = static_cast<uint64_t>(min_message);
  p.link_Bps_prior = mbps * 1e6;
  p.long_link_Bps = long_mbps * 1e6;
  p.topk = topk ? fraction : 0;
  *policy = p;
  return true;
}

}  // namespace xsilo
