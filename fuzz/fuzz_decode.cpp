// libFuzzer target: the frame and safetensors decoders must turn any input
// into a Message or a Status, never a crash or an unbounded allocation.
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "xsilo/core/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  xsilo::Buffer input = xsilo::Buffer::CopyFrom(data, size);
  xsilo::DecodeLimits limits;
  limits.max_header_bytes = 1 << 20;
  limits.max_payload_bytes = 1 << 20;
  auto m = xsilo::DecodeMessage(input, limits);
  if (m.ok()) {
    // Whatever decodes must re-encode and decode to the same tensors.
    auto again = xsilo::DecodeMessage(*xsilo::EncodeMessage(*m).bytes.Flatten(), limits);
    if (!again.ok() || again->tensors.size() != m->tensors.size()) __builtin_trap();
  }
  // Also treat the input as a bare safetensors payload, checksum off.
  limits.verify_checksum = false;
  auto t = xsilo::DecodeSafetensors(input, limits);
  if (t.ok()) {
    for (const auto& [name, tensor] : *t) {
      if (tensor.data.size() > 0 &&
          tensor.data.data() + tensor.data.size() > input.data() + input.size()) {
        __builtin_trap();
      }
    }
  }
  return 0;
}
