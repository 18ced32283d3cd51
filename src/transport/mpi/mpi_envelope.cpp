// The envelope of a message (or a fin) on an MPI link (mpi_engine.h).
#include <climits>
#include <cstring>

#include "transport/mpi/mpi_engine_internal.h"

namespace xsilo::mpi {

Buffer FinEnvelope() {
  Buffer b = std::move(Buffer::AllocateZeroed(sizeof(EnvelopeFixed))).value();
  EnvelopeFixed f{};
  f.magic = kEnvelopeMagic;
  f.kind = kKindFin;
  std::memcpy(b.mutable_data(), &f, sizeof f);
  return b;
}

Result<Buffer> BuildMessageEnvelope(const std::vector<Buffer>& segments, uint64_t chunk_bytes,
                                    uint64_t inline_len,
                                    const std::function<void(uint8_t*)>& write_inline) {
  const uint64_t size = sizeof(EnvelopeFixed) + 8 * segments.size() + inline_len;
  if (size > static_cast<uint64_t>(INT_MAX)) {
    return InvalidArgument("message envelope of " + std::to_string(size) +
                           " bytes exceeds an MPI count (too many tensors or too large a header)");
  }
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(size));
  EnvelopeFixed f{};
  f.magic = kEnvelopeMagic;
  f.kind = kKindMessage;
  f.chunk_bytes = chunk_bytes;
  f.inline_len = inline_len;
  f.segment_count = segments.size();
  uint8_t* d = b.mutable_data();
  std::memcpy(d, &f, sizeof f);
  d += sizeof f;
  for (const Buffer& s : segments) {
    uint64_t n = s.size();
    std::memcpy(d, &n, 8);
    d += 8;
  }
  if (inline_len > 0) write_inline(d);
  return b;
}

}  // namespace xsilo::mpi
