#include "store/zmq/zmq_protocol.h"

#include <cerrno>
#include <charconv>
#include <cstring>

namespace xsilo::zmq_store {

namespace {

void PutU64(char* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

uint64_t GetU64(const char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
  return v;
}

std::string Header(const char* magic, uint8_t a, uint8_t b, uint64_t request, uint64_t total,
                   uint64_t offset) {
  std::string h(kHeaderBytes, '\0');
  std::memcpy(h.data(), magic, 4);
  h[4] = static_cast<char>(a);
  h[5] = static_cast<char>(b);
  PutU64(h.data() + 8, request);
  PutU64(h.data() + 16, total);
  PutU64(h.data() + 24, offset);
  return h;
}

}  // namespace

std::string EncodeRequest(const RequestHeader& h) {
  return Header("XZQ1", static_cast<uint8_t>(h.op), 0, h.request, h.total, h.offset) + h.id;
}

std::optional<RequestHeader> DecodeRequest(std::string_view b) {
  if (b.size() < kHeaderBytes || b.size() > kHeaderBytes + kMaxIdBytes ||
      b.substr(0, 4) != "XZQ1") {
    return std::nullopt;
  }
  RequestHeader h;
  auto op = static_cast<uint8_t>(b[4]);
  if (op < static_cast<uint8_t>(Op::kSet) || op > static_cast<uint8_t>(Op::kEvict)) {
    return std::nullopt;
  }
  h.op = static_cast<Op>(op);
  h.request = GetU64(b.data() + 8);
  h.total = GetU64(b.data() + 16);
  h.offset = GetU64(b.data() + 24);
  h.id = std::string(b.substr(kHeaderBytes));
  if (h.id.empty()) return std::nullopt;
  return h;
}

std::string EncodeReply(const ReplyHeader& h) {
  return Header("XZR1", static_cast<uint8_t>(h.kind), static_cast<uint8_t>(h.code), h.request,
                h.total, h.offset);
}

std::optional<ReplyHeader> DecodeReply(std::string_view b) {
  if (b.size() != kHeaderBytes || b.substr(0, 4) != "XZR1") return std::nullopt;
  ReplyHeader h;
  auto kind = static_cast<uint8_t>(b[4]);
  if (kind > static_cast<uint8_t>(ReplyKind::kError)) return std::nullopt;
  h.kind = static_cast<ReplyKind>(kind);
  auto code = static_cast<uint8_t>(b[5]);
  if (code > static_cast<uint8_t>(StatusCode::kInternal)) return std::nullopt;
  h.code = static_cast<StatusCode>(code);
  h.request = GetU64(b.data() + 8);
  h.total = GetU64(b.data() + 16);
  h.offset = GetU64(b.data() + 24);
  return h;
}

int SendCopy(void* socket, std::string_view bytes, int flags) {
  return zmq_send(socket, bytes.data(), bytes.size(), flags) < 0 ? -1 : 0;
}

int SendBuffer(void* socket, const Buffer& bytes, int flags) {
  if (bytes.empty()) return SendCopy(socket, {}, flags);
  zmq_msg_t msg;
  auto* hold = new Buffer(bytes);
  // libzmq calls the free function (possibly on its I/O thread) once the
  // frame is written or dropped; the Buffer reference keeps the bytes alive.
  if (zmq_msg_init_data(
          &msg, bytes.mutable_data(), bytes.size(),
          [](void*, void* hint) { delete static_cast<Buffer*>(hint); }, hold) != 0) {
    delete hold;
    return -1;
  }
  if (zmq_msg_send(&msg, socket, flags) < 0) {
    int e = errno;
    zmq_msg_close(&msg);  // frees the hold
    errno = e;
    return -1;
  }
  return 0;
}

std::string TcpAddress(const std::string& host, int port) {
  bool v6 = host.find(':') != std::string::npos && host.front() != '[';
  return "tcp://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool IsTcpAddress(std::string_view a) {
  if (a.substr(0, 6) != "tcp://") return false;
  auto colon = a.rfind(':');
  if (colon == std::string_view::npos || colon <= 6) return false;
  int port = 0;
  auto [p, ec] = std::from_chars(a.data() + colon + 1, a.data() + a.size(), port);
  return ec == std::errc() && p == a.data() + a.size() && port > 0 && port < 65536;
}

std::string ZmqError(const char* what) { return std::string(what) + ": " + zmq_strerror(errno); }

}  // namespace xsilo::zmq_store
