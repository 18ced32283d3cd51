// EncodeStream: a message's payload handed out while it is still being
// encoded (docs/compression.md, "Streamed uploads").
//
// CompressMessage appends, in order, the bytes that will be the message's
// tensor data in safetensors payload order (PayloadOrder): a tensor that
// travels as it is at once, an encoded one chunk by chunk as the chunks
// are finished. A transport reads the bytes as they come and puts them on
// the wire; when the encoder is done the sender Finish()es the stream with
// the final message, whose tensors are exactly the appended bytes (Holds
// checks it). When a tensor does not go the way the encoder planned (it
// did not get smaller, or a lossy difference was not finite) the stream is
// Abandon()ed: what was appended is not the payload, and the reader must
// send the final message the ordinary way.
//
// Thread safety: one producer (Append, Abandon, Finish) and any number of
// readers.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/message.h"
#include "xsilo/core/status.h"

namespace xsilo {

class EncodeStream {
 public:
  // `expected_bytes`: what the payload is expected to come to (a reader
  // plans its parts by it); 0 when unknown.
  explicit EncodeStream(uint64_t expected_bytes = 0) : expected_bytes_(expected_bytes) {}
  EncodeStream(const EncodeStream&) = delete;
  EncodeStream& operator=(const EncodeStream&) = delete;

  uint64_t expected_bytes() const { return expected_bytes_; }
  // Called on the producer's thread after each Append with the bytes
  // appended so far (set before the stream is used; for tests).
  std::function<void(uint64_t ready)> on_append;

  // Producer. Bytes that are final; they must stay unchanged until every
  // reader is done (the Buffer keeps them alive). `input_bytes`: how many
  // of the producer's input bytes they stand for (a chunk's raw size), of
  // SetInputBytes' total: readers estimate the payload's size by them.
  void SetInputBytes(uint64_t total);
  void Append(Buffer bytes, uint64_t input_bytes);
  // What was appended is not the payload (and nothing more is appended).
  void Abandon();
  // The final message (or the encoder's error); wakes every reader.
  void Finish(Result<Message> message);

  // Reader.
  struct State {
    uint64_t ready = 0;      // bytes appended
    bool abandoned = false;  // Abandon() was called
    bool finished = false;   // Finish() was called
  };
  State Now() const;
  // What the payload is expected to come to: the bytes so far scaled by
  // the input they stood for, else expected_bytes(), and never less than
  // what is appended.
  uint64_t Estimate() const;
  // Blocks until more than `have` bytes were appended, or the stream was
  // abandoned or finished.
  State WaitBeyond(uint64_t have) const;
  // Blocks until Finish, then hands out the final message (once).
  Result<Message> TakeMessage();
  // [offset, offset + length) of the appended bytes (must be appended).
  GatherList Range(uint64_t offset, uint64_t length) const;
  // Whether `order` (tensors in payload order) are exactly the appended
  // bytes: the same Buffers, contiguous and in order, and nothing more.
  bool Holds(const std::vector<const Tensor*>& order) const;

 private:
  const uint64_t expected_bytes_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  std::vector<Buffer> pieces_;
  std::vector<uint64_t> starts_;  // offset of each piece
  uint64_t ready_ = 0;
  uint64_t input_total_ = 0, input_done_ = 0;
  bool abandoned_ = false;
  bool finished_ = false;
  std::optional<Result<Message>> message_;
};

}  // namespace xsilo
