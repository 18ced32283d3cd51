// Message: the unit every transport moves.
//
// A Message is a small header (type, round, sender, receivers, typed
// parameters) plus a TensorMap of named tensors. Tensor bytes live in
// Buffers, so building, copying and forwarding a Message never copies
// payload bytes.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/core/status.h"

namespace xsilo {

// The safetensors dtype set.
enum class DType : uint8_t { kF64, kF32, kF16, kBF16, kI64, kI32, kI16, kI8, kU8, kBool };

uint64_t DTypeSize(DType dtype);
std::string_view DTypeName(DType dtype);  // "F32", "BOOL", ...
Result<DType> ParseDType(std::string_view name);

struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  Buffer data;

  // Validates that data.size() == product(shape) * DTypeSize(dtype) with no
  // negative dims and no overflow.
  static Result<Tensor> Make(DType dtype, std::vector<int64_t> shape, Buffer data);
  // A zero-filled tensor of the given dtype and shape.
  static Result<Tensor> Zeros(DType dtype, std::vector<int64_t> shape);

  uint64_t nbytes() const { return data.size(); }
};

// Product of dims, or nullopt if a dim is negative or the product overflows.
std::optional<uint64_t> ElementCount(const std::vector<int64_t>& shape);

// Named tensors, ordered by name.
using TensorMap = std::map<std::string, Tensor, std::less<>>;
uint64_t TotalBytes(const TensorMap& tensors);

// A parameter value. std::vector<uint8_t> is the "bytes" type.
using Bytes = std::vector<uint8_t>;
using ParamValue = std::variant<std::string, int64_t, double, Bytes>;

struct Message {
  std::string type;     // application-defined, e.g. "model", "update"
  int64_t round = 0;    // FL round or sequence number
  int32_t sender = -1;  // rank of the sender (filled by transports)
  std::vector<int32_t> receivers;
  std::map<std::string, ParamValue, std::less<>> params;
  TensorMap tensors;

  uint64_t payload_bytes() const { return TotalBytes(tensors); }

  // Typed parameter access; NotFound / InvalidArgument on absence or type mismatch.
  Result<std::string> GetString(std::string_view key) const;
  Result<int64_t> GetInt(std::string_view key) const;
  Result<double> GetDouble(std::string_view key) const;
  Result<Bytes> GetBytes(std::string_view key) const;
};

}  // namespace xsilo
