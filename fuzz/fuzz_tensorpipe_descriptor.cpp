// libFuzzer target for the tensorpipe transport's descriptor parser
// (src/transport/tensorpipe/descriptor.h), which sees bytes from the peer.
// Input: 1 control byte (bit 0: the rest is the whole metadata, else the
// rest is a tensor table appended to a valid header so the table parser is
// reached past the header checksum; bits 1-3: piece count), that many u16
// piece lengths, then the bytes.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "transport/tensorpipe/descriptor.h"

namespace {

// "XTP1" + the header frame of a message without tensors.
const std::string& ValidHeader() {
  static const std::string header = [] {
    xsilo::Message m;
    m.type = "model";
    m.round = 1;
    std::string md = xsilo::tplink::PlanOutgoing(m, 1 << 20, false).metadata;
    return md.substr(0, md.size() - 4);  // drop the empty table's count
  }();
  return header;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const bool raw = (data[0] & 1) != 0;
  const size_t pieces = (data[0] >> 1) % 8;
  size_t pos = 1;
  std::vector<uint64_t> lengths;
  for (size_t i = 0; i < pieces && pos + 2 <= size; ++i, pos += 2) {
    uint16_t len = 0;
    std::memcpy(&len, data + pos, 2);
    lengths.push_back(len);
  }
  std::string metadata = raw ? std::string() : ValidHeader();
  metadata.append(reinterpret_cast<const char*>(data + pos), size - pos);
  auto plan = xsilo::tplink::PlanIncoming(metadata, lengths, 1 << 20);
  if (plan.ok()) {
    for (const auto& p : plan->pieces) std::memset(p.data, 0x5a, p.length);
    (void)xsilo::tplink::VerifyIncoming(*plan);
  }
  return 0;
}
