// Codec<T>: how a Store turns an object into bytes and back.
//
// A specialization provides
//   static Result<GatherList> Encode(const T& object);
//   static Result<T> Decode(const Buffer& bytes);
// Decode may return views into `bytes` (the Buffer keeps them alive).
// Specializations ship for Buffer (raw bytes), std::string, TensorMap
// (a safetensors file, decoded zero-copy) and Message (the xsilo frame,
// decoded zero-copy). A user type joins by specializing Codec in namespace
// xsilo:
//
//   template <> struct xsilo::Codec<Point> {
//     static Result<GatherList> Encode(const Point& p) { ... }
//     static Result<Point> Decode(const Buffer& b) { ... }
//   };
#pragma once

#include <concepts>
#include <string>

#include "xsilo/core/buffer.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo {

template <typename T>
struct Codec;  // no default: an unsupported type fails to compile

template <typename T>
concept Encodable = requires(const T& object, const Buffer& bytes) {
  { Codec<T>::Encode(object) } -> std::same_as<Result<GatherList>>;
  { Codec<T>::Decode(bytes) } -> std::same_as<Result<T>>;
};

template <>
struct Codec<Buffer> {
  static Result<GatherList> Encode(const Buffer& b) {
    GatherList g;
    g.Append(b);
    return g;
  }
  static Result<Buffer> Decode(const Buffer& b) { return b; }
};

template <>
struct Codec<std::string> {
  static Result<GatherList> Encode(const std::string& s) {
    GatherList g;
    g.Append(Buffer::CopyFrom(s));
    return g;
  }
  static Result<std::string> Decode(const Buffer& b) { return std::string(b.view()); }
};

template <>
struct Codec<TensorMap> {
  static Result<GatherList> Encode(const TensorMap& t) {
    // Only the bytes are stored: the payload checksum would be thrown away.
    return EncodeSafetensors(t, {}, /*checksum=*/false).bytes;
  }
  static Result<TensorMap> Decode(const Buffer& b) { return DecodeSafetensors(b); }
};

template <>
struct Codec<Message> {
  static Result<GatherList> Encode(const Message& m) { return EncodeMessage(m).bytes; }
  static Result<Message> Decode(const Buffer& b) { return DecodeMessage(b); }
};

}  // namespace xsilo
