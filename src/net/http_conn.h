// Private to net: one connection of the HttpServer: whole
// writes (plain or TLS, sendfile for file bodies), buffered reads, and the
// request body reader (Content-Length, chunked, 100-continue).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <algorithm>
#include <string>
#include <string_view>
#include <vector>

#include "net/http_server.h"

namespace xsilo::net {

// Writes the whole iovec list; false when the peer is gone or a send timed out.
bool SendAll(const Link& link, std::vector<iovec>& iov);
// Sends n bytes of `file` from `offset`. Plain: sendfile(2), the kernel moves
// page references to the socket and nothing passes through user space. TLS:
// read and encrypted 1 MiB at a time. False on an error, a timeout (the
// socket's send timeout) or a file shorter than promised.
bool SendFile(const Link& link, int file, uint64_t offset, uint64_t n);
bool SendString(const Link& link, std::string_view s);
// One read: <= 0 on EOF, error or timeout.
ssize_t Recv(const Link& link, void* dst, size_t n);

// Buffered reader over one connection's socket.
struct Conn {
  Link link;
  std::string buf;
  size_t start = 0;  // unread bytes are buf[start, buf.size())

  size_t buffered() const { return buf.size() - start; }
  void Compact() {
    if (start > 0) {
      buf.erase(0, start);
      start = 0;
    }
  }
  // Appends what one recv returns; <= 0 on EOF/error/timeout.
  ssize_t Fill() {
    Compact();
    size_t old = buf.size();
    buf.resize(old + 16384);
    ssize_t n = Recv(link, buf.data() + old, 16384);
    buf.resize(old + std::max<ssize_t>(n, 0));
    return n;
  }
};

class ConnBodyReader : public BodyReader {
 public:
  ConnBodyReader(Conn& conn, const HttpRequest& req, bool expect_continue, uint64_t max_line_bytes)
      : conn_(conn),
        chunked_(req.chunked),
        remaining_(req.has_content_length ? req.content_length : 0),
        expect_continue_(expect_continue),
        max_line_bytes_(max_line_bytes) {}

  bool pending() const override { return chunked_ ? !chunked_done_ : remaining_ > 0; }

  Result<Buffer> ReadAll(uint64_t limit, const Observer& observe) override;

 private:
  Status SendContinue();

  // n bytes into dst: what is buffered first, then straight from the socket.
  Status ReadExact(uint8_t* dst, uint64_t n, const Observer& observe);

  // One CRLF-terminated line of the chunked framing, without the CRLF.
  Result<std::string> ReadLine();

  // Transfer-Encoding: chunked (RFC 9112 7.1): chunk sizes in hex, chunk
  // extensions ignored, trailer fields read and dropped.
  Result<Buffer> ReadChunked(uint64_t limit, const Observer& observe);

  Conn& conn_;
  const bool chunked_;
  bool chunked_done_ = false;
  uint64_t remaining_;
  bool expect_continue_;
  const uint64_t max_line_bytes_;
};

}  // namespace xsilo::net
