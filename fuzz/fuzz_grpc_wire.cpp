// libFuzzer target: the grpc link's frame parser (src/transport/grpc/wire.cpp),
// which reads every frame a peer sends, chunks in place over gRPC's receive
// slices. The last bytes pick how the rest is cut into slices (a frame
// arrives in any number of pieces; FuzzedDataProvider takes integers from
// the end). Whatever the bytes:
//  - ParseIncoming never reads outside them (ASan);
//  - a chunk's pieces lie inside the received slices (or the protobuf
//    frame) and their lengths add up to no more than the frame;
//  - a frame the fast path accepts parses the same with protobuf.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "transport/grpc/wire.h"

using xsilo::grpclink::Incoming;
using xsilo::grpclink::ParseIncoming;

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

bool Inside(const uint8_t* p, uint64_t n, const std::vector<grpc::Slice>& slices) {
  for (const auto& s : slices) {
    if (p >= s.begin() && p + n <= s.end()) return true;
  }
  return false;
}

void Hostile(FuzzedDataProvider& in) {
  std::vector<size_t> cuts;
  const int pieces = in.ConsumeIntegralInRange<int>(1, 6);
  for (int i = 0; i < pieces - 1; ++i) cuts.push_back(in.ConsumeIntegralInRange<size_t>(0, 64));
  std::vector<uint8_t> bytes = in.ConsumeRemainingBytes<uint8_t>();
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t c : cuts) {
    const size_t n = std::min(c, bytes.size() - at);
    slices.emplace_back(bytes.data() + at, n);  // copies
    at += n;
  }
  slices.emplace_back(bytes.data() + at, bytes.size() - at);
  grpc::ByteBuffer buffer(slices.data(), slices.size());
  Incoming got;
  if (!ParseIncoming(buffer, &got) || !got.is_chunk) return;
  uint64_t total = 0;
  for (const auto& p : got.chunk.pieces) {
    total += p.size();
    if (!got.slices.empty()) Check(Inside(p.data(), p.size(), got.slices));
  }
  Check(total <= bytes.size());
  if (!got.slices.empty()) {
    // The fast path: protobuf must read the same chunk.
    std::string flat(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    xsilo::grpclink::Frame frame;
    Check(frame.ParseFromString(flat) && frame.has_chunk());
    Check(frame.chunk().message_id() == got.chunk.message_id);
    Check(frame.chunk().offset() == got.chunk.offset);
    Check(frame.chunk().total() == got.chunk.total);
    Check(frame.chunk().payload_offset() == got.chunk.payload_offset);
    Check(frame.chunk().data().size() == total);
    std::string joined;
    for (const auto& p : got.chunk.pieces)
      joined.append(reinterpret_cast<const char*>(p.data()), p.size());
    Check(joined == frame.chunk().data());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  Hostile(in);
  return 0;
}
