// libFuzzer target: the receive side of the gRPC link (Reassembler), which
// turns chunks from a peer into whole frames. The first byte picks a mode:
//
//  - hostile: the rest is a list of arbitrary chunks (stream, id, offset,
//    total, length) over a pool of bytes. Whatever they say, messages leave
//    in id order, each id once; a delivered frame has exactly the size its
//    chunks announced and never more than max_message_bytes; memory held
//    for partial messages stays within max_open_messages of them.
//  - honest: the rest is the payload of two real frames and a plan to cut
//    them into chunks and spread those over 1-4 streams, each stream in
//    send order, the streams interleaved arbitrarily (what a striped sender
//    and the network may do); a frame may go prefix last, as the sender
//    does for big payloads (its chunks then carry the payload offset).
//    Both frames must come out whole, identical, once, in order, and the
//    checksum hashed on the way in, where there is one, must be the
//    prefix's (always there for a frame sent prefix last).
#include <fuzzer/FuzzedDataProvider.h>

#include <cstdint>
#include <cstring>
#include <deque>
#include <map>
#include <vector>

#include "transport/grpc/reassembly.h"
#include "xsilo/core/codec.h"

using xsilo::grpclink::Reassembled;
using xsilo::grpclink::Reassembler;
using xsilo::grpclink::ReassemblyLimits;

namespace {

constexpr uint64_t kMaxMessage = 1 << 16;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

void Hostile(FuzzedDataProvider& in) {
  ReassemblyLimits limits;
  limits.max_message_bytes = kMaxMessage;
  limits.max_open_messages = 4;
  limits.id_window = 64;
  const int streams = in.ConsumeIntegralInRange<int>(1, 4);
  Reassembler r(limits, streams);
  std::vector<uint8_t> pool = in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 4096));
  std::map<uint64_t, uint64_t> first_total;  // the total each id announced first
  uint64_t last_released = 0;
  while (in.remaining_bytes() > 0) {
    const int stream = in.ConsumeIntegralInRange<int>(-1, streams);  // one bad index each side
    uint64_t id = in.ConsumeIntegralInRange<uint64_t>(0, 80);
    if (in.ConsumeBool()) id = in.ConsumeIntegral<uint64_t>();
    uint64_t total = in.ConsumeIntegralInRange<uint64_t>(0, 2 * kMaxMessage);
    if (in.ConsumeProbability<float>() < 0.05f) total = uint64_t{1} << 62;
    uint64_t offset = in.ConsumeIntegralInRange<uint64_t>(0, total + 16);
    if (in.ConsumeProbability<float>() < 0.05f) offset = in.ConsumeIntegral<uint64_t>();
    const size_t len = in.ConsumeIntegralInRange<size_t>(0, pool.size());
    const size_t from = pool.empty() ? 0 : in.ConsumeIntegralInRange<size_t>(0, pool.size() - len);
    uint64_t payload_offset = 0;
    if (in.ConsumeProbability<float>() < 0.2f)
      payload_offset = in.ConsumeIntegralInRange<uint64_t>(0, total + 16);
    std::vector<Reassembled> ready;
    // A refused chunk changes nothing; the first one taken fixes the total.
    if (r.OnChunk(stream, id, offset, total, std::span<const uint8_t>(pool.data() + from, len),
                  &ready, payload_offset)
            .ok())
      first_total.emplace(id, total);
    for (const Reassembled& m : ready) {
      Check(m.message_id == last_released + 1);
      last_released = m.message_id;
      if (m.status.ok()) {
        Check(m.frame.size() == first_total[m.message_id]);
        Check(m.frame.size() <= kMaxMessage);
      } else {
        Check(m.frame.empty());
      }
    }
    Check(r.open_messages() <= limits.max_open_messages);
    Check(r.open_bytes() <= limits.max_open_messages * kMaxMessage);
  }
}

struct TestFrame {
  std::vector<uint8_t> bytes;
  uint64_t payload_offset = 0;
  uint64_t payload_checksum = 0;
};

TestFrame Frame(const std::vector<uint8_t>& payload, int64_t round) {
  xsilo::Message m;
  m.type = "fuzz";
  m.round = round;
  m.params["p"] = xsilo::Bytes(payload.begin(), payload.end());
  if (payload.size() >= 8) {  // a tensor too, so that the payload is not only a header
    auto t = xsilo::Buffer::Allocate(payload.size());
    std::memcpy(t->mutable_data(), payload.data(), payload.size());
    m.tensors["t"] = xsilo::Tensor{
        xsilo::DType::kU8, {static_cast<int64_t>(payload.size())}, std::move(t).value()};
  }
  xsilo::EncodedFrame e = xsilo::EncodeMessage(m);
  xsilo::Buffer flat = *e.bytes.Flatten();
  return {std::vector<uint8_t>(flat.data(), flat.data() + flat.size()), e.payload_offset,
          e.payload_checksum};
}

void Honest(FuzzedDataProvider& in) {
  const int streams = in.ConsumeIntegralInRange<int>(1, 4);
  const TestFrame frames[2] = {
      Frame(in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 2048)), 1),
      Frame(in.ConsumeBytes<uint8_t>(in.ConsumeIntegralInRange<size_t>(0, 2048)), 2)};
  const bool prefix_last[2] = {in.ConsumeBool(), in.ConsumeBool()};
  struct Piece {
    uint64_t id, offset, total;
    size_t len;
    uint64_t payload_offset;
  };
  // The sender: message 1's chunks, then message 2's, each to some stream.
  // Prefix last: [payload_offset, size) in chunks, then the head in one.
  std::vector<std::deque<Piece>> wire(static_cast<size_t>(streams));
  auto to_some_stream = [&](Piece p) {
    wire[in.ConsumeIntegralInRange<size_t>(0, wire.size() - 1)].push_back(p);
  };
  for (uint64_t id = 1; id <= 2; ++id) {
    const TestFrame& f = frames[id - 1];
    const uint64_t size = f.bytes.size();
    const uint64_t head = prefix_last[id - 1] ? f.payload_offset : 0;
    for (uint64_t off = head; off < size;) {
      size_t len = in.ConsumeIntegralInRange<size_t>(1, 512);
      len = std::min<size_t>(len, size - off);
      to_some_stream({id, off, size, len, head});
      off += len;
    }
    if (head > 0) to_some_stream({id, 0, size, head, head});
  }
  ReassemblyLimits limits;
  limits.max_message_bytes = kMaxMessage;
  Reassembler r(limits, streams);
  std::vector<Reassembled> out;
  // The network: the streams' heads in any interleaving.
  for (;;) {
    std::vector<size_t> live;
    for (size_t s = 0; s < wire.size(); ++s)
      if (!wire[s].empty()) live.push_back(s);
    if (live.empty()) break;
    size_t s = live[in.ConsumeIntegralInRange<size_t>(0, live.size() - 1)];
    Piece p = wire[s].front();
    wire[s].pop_front();
    const auto& f = frames[p.id - 1].bytes;
    Check(r.OnChunk(static_cast<int>(s), p.id, p.offset, p.total,
                    std::span<const uint8_t>(f.data() + p.offset, p.len), &out, p.payload_offset)
              .ok());
  }
  Check(out.size() == 2);
  for (uint64_t id = 1; id <= 2; ++id) {
    const Reassembled& m = out[id - 1];
    const auto& f = frames[id - 1].bytes;
    Check(m.message_id == id && m.status.ok());
    Check(m.frame.size() == f.size() && std::memcmp(m.frame.data(), f.data(), f.size()) == 0);
    if (prefix_last[id - 1]) Check(m.payload_checksum.has_value());
    if (m.payload_checksum) Check(*m.payload_checksum == frames[id - 1].payload_checksum);
  }
  Check(r.open_messages() == 0 && r.open_bytes() == 0);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  if (in.ConsumeBool()) {
    Hostile(in);
  } else {
    Honest(in);
  }
  return 0;
}
