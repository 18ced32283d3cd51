#include "xsilo/core/message.h"

#include <array>
#include <cstring>

namespace xsilo {

namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  uint64_t size;
};

constexpr std::array<DTypeInfo, 10> kDTypes = {{
    {DType::kF64, "F64", 8},
    {DType::kF32, "F32", 4},
    {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},
    {DType::kI64, "I64", 8},
    {DType::kI32, "I32", 4},
    {DType::kI16, "I16", 2},
    {DType::kI8, "I8", 1},
    {DType::kU8, "U8", 1},
    {DType::kBool, "BOOL", 1},
}};

template <typename T>
Result<T> GetParam(const Message& m, std::string_view key, std::string_view type_name) {
  auto it = m.params.find(key);
  if (it == m.params.end()) return NotFound("message has no parameter '" + std::string(key) + "'");
  if (const T* v = std::get_if<T>(&it->second)) return *v;
  return InvalidArgument("parameter '" + std::string(key) + "' is not of type " +
                         std::string(type_name));
}

}  // namespace

uint64_t DTypeSize(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].size; }
std::string_view DTypeName(DType dtype) { return kDTypes[static_cast<size_t>(dtype)].name; }

Result<DType> ParseDType(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return InvalidArgument("unknown dtype '" + std::string(name) + "'");
}

std::optional<uint64_t> ElementCount(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    uint64_t ud = static_cast<uint64_t>(d);
    if (ud != 0 && n > UINT64_MAX / ud) return std::nullopt;
    n *= ud;
  }
  return n;
}

Result<Tensor> Tensor::Make(DType dtype, std::vector<int64_t> shape, Buffer data) {
  auto count = ElementCount(shape);
  if (!count) return InvalidArgument("tensor shape has a negative dimension or overflows");
  uint64_t esize = DTypeSize(dtype);
  if (*count > UINT64_MAX / esize) return InvalidArgument("tensor byte size overflows");
  if (*count * esize != data.size()) {
    return InvalidArgument("tensor of " + std::to_string(*count) + " " +
                           std::string(DTypeName(dtype)) + " elements needs " +
                           std::to_string(*count * esize) + " bytes, buffer has " +
                           std::to_string(data.size()));
  }
  return Tensor{dtype, std::move(shape), std::move(data)};
}

Result<Tensor> Tensor::Zeros(DType dtype, std::vector<int64_t> shape) {
  auto count = ElementCount(shape);
  if (!count || *count > UINT64_MAX / DTypeSize(dtype)) {
    return InvalidArgument("tensor shape has a negative dimension or overflows");
  }
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::AllocateZeroed(*count * DTypeSize(dtype)));
  return Make(dtype, std::move(shape), std::move(b));
}

uint64_t TotalBytes(const TensorMap& tensors) {
  uint64_t total = 0;
  for (const auto& [name, t] : tensors) total += t.nbytes();
  return total;
}

Result<std::string> Message::GetString(std::string_view key) const {
  return GetParam<std::string>(*this, key, "string");
}
Result<int64_t> Message::GetInt(std::string_view key) const {
  return GetParam<int64_t>(*this, key, "int");
}
Result<double> Message::GetDouble(std::string_view key) const {
  return GetParam<double>(*this, key, "double");
}
Result<Bytes> Message::GetBytes(std::string_view key) const {
  return GetParam<Bytes>(*this, key, "bytes");
}

}  // namespace xsilo
