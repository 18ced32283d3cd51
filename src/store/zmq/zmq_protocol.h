// The zmq connector's wire protocol and the libzmq helpers both ends use.
//
// A client (DEALER) talks to an object server (ROUTER). Every message, in
// either direction, is two frames: a fixed binary header and a data frame
// (possibly empty). Integers are little-endian.
//
//   request header (32 bytes + id): "XZQ1", op u8, 3 pad bytes,
//     request u64 (echoed in replies), total u64, offset u64, object id
//   reply header (32 bytes): "XZR1", kind u8, status code u8, 2 pad bytes,
//     request u64, total u64, offset u64
//
// kSet carries the object as chunks of at most chunk_bytes, one message per
// chunk (offset = where the chunk goes, total = object size); the server
// answers once, after the last chunk. kGet is answered by one message per
// chunk (kind kFound) or one kMissing; kExists by kFound or kMissing; kEvict
// by kFound. kError carries a StatusCode and a message in its data frame.
#pragma once

#include <zmq.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "xsilo/core/buffer.h"
#include "xsilo/core/status.h"

namespace xsilo::zmq_store {

enum class Op : uint8_t { kSet = 1, kGet = 2, kExists = 3, kEvict = 4 };
enum class ReplyKind : uint8_t { kFound = 0, kMissing = 1, kError = 2 };

inline constexpr size_t kHeaderBytes = 32;
inline constexpr size_t kMaxIdBytes = 128;

struct RequestHeader {
  Op op = Op::kGet;
  uint64_t request = 0;
  uint64_t total = 0;
  uint64_t offset = 0;
  std::string id;
};

struct ReplyHeader {
  ReplyKind kind = ReplyKind::kFound;
  StatusCode code = StatusCode::kOk;
  uint64_t request = 0;
  uint64_t total = 0;
  uint64_t offset = 0;
};

std::string EncodeRequest(const RequestHeader& h);
// nullopt when the bytes are not a well-formed request header.
std::optional<RequestHeader> DecodeRequest(std::string_view bytes);
std::string EncodeReply(const ReplyHeader& h);
std::optional<ReplyHeader> DecodeReply(std::string_view bytes);

// RAII zmq_msg_t.
class Frame {
 public:
  Frame() { zmq_msg_init(&msg_); }
  ~Frame() { zmq_msg_close(&msg_); }
  Frame(const Frame&) = delete;
  Frame& operator=(const Frame&) = delete;
  zmq_msg_t* get() { return &msg_; }
  std::string_view view() {
    return {static_cast<const char*>(zmq_msg_data(&msg_)), zmq_msg_size(&msg_)};
  }
  size_t size() { return zmq_msg_size(&msg_); }
  bool more() { return zmq_msg_more(&msg_) != 0; }

 private:
  zmq_msg_t msg_;
};

// Sends a frame holding a copy of `bytes`; 0 or -1 with errno set.
int SendCopy(void* socket, std::string_view bytes, int flags);
// Sends `bytes` as a frame without copying: the frame keeps a reference to
// the Buffer's storage until libzmq is done with it.
int SendBuffer(void* socket, const Buffer& bytes, int flags);

// "tcp://host:port"; `host` may be an IPv6 literal (bracketed here).
std::string TcpAddress(const std::string& host, int port);
// A key's address must look like tcp://host:port.
bool IsTcpAddress(std::string_view address);

std::string ZmqError(const char* what);

}  // namespace xsilo::zmq_store
