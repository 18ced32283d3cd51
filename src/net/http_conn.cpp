#include "net/http_conn.h"

#include <openssl/ssl.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

#include "net/crypto.h"
#include "net/sigpipe.h"

namespace xsilo::net {

namespace {

// Worker threads block SIGPIPE (HttpServer::WorkerLoop); a failed write
// takes back what it raised.
using net::DrainSigpipe;

// One write of a TLS session, whole (SSL_MODE_AUTO_RETRY, blocking socket).
bool TlsWrite(SSL* ssl, const void* data, size_t n) {
  while (n > 0) {
    const int chunk = static_cast<int>(std::min<size_t>(n, 1 << 30));
    const int w = SSL_write(ssl, data, chunk);
    if (w <= 0) {
      DrainSigpipe();
      return false;
    }
    data = static_cast<const char*>(data) + w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

}  // namespace

bool SendAll(const Link& link, std::vector<iovec>& iov) {
  if (link.ssl != nullptr) {
    // Small pieces (the response head) go out with the bytes after them
    // instead of in a TLS record of their own.
    std::string small;
    for (const iovec& v : iov) {
      if (v.iov_len < 16384) {
        small.append(static_cast<const char*>(v.iov_base), v.iov_len);
        continue;
      }
      if (!small.empty() && !TlsWrite(link.ssl, small.data(), small.size())) return false;
      small.clear();
      if (!TlsWrite(link.ssl, v.iov_base, v.iov_len)) return false;
    }
    return small.empty() || TlsWrite(link.ssl, small.data(), small.size());
  }
  const int fd = link.fd;
  size_t first = 0;
  while (first < iov.size()) {
    if (iov[first].iov_len == 0) {
      ++first;
      continue;
    }
    msghdr msg{};
    msg.msg_iov = iov.data() + first;
    msg.msg_iovlen = std::min<size_t>(iov.size() - first, IOV_MAX);
    ssize_t n = ::sendmsg(fd, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    size_t left = static_cast<size_t>(n);
    while (left > 0 && first < iov.size()) {
      size_t take = std::min(left, iov[first].iov_len);
      iov[first].iov_base = static_cast<char*>(iov[first].iov_base) + take;
      iov[first].iov_len -= take;
      left -= take;
      if (iov[first].iov_len == 0) ++first;
    }
  }
  return true;
}

bool SendFile(const Link& link, int file, uint64_t offset, uint64_t n) {
  if (link.ssl != nullptr) {
    std::vector<char> buf(std::min<uint64_t>(n, 1 << 20));
    while (n > 0) {
      const size_t want = static_cast<size_t>(std::min<uint64_t>(n, buf.size()));
      const ssize_t r = ::pread(file, buf.data(), want, static_cast<off_t>(offset));
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0 || !TlsWrite(link.ssl, buf.data(), static_cast<size_t>(r))) return false;
      offset += static_cast<uint64_t>(r);
      n -= static_cast<uint64_t>(r);
    }
    return true;
  }
  off_t off = static_cast<off_t>(offset);
  while (n > 0) {
    ssize_t w =
        ::sendfile(link.fd, file, &off, static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30)));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EPIPE) DrainSigpipe();
    if (w <= 0) return false;
    n -= static_cast<uint64_t>(w);
  }
  return true;
}

bool SendString(const Link& link, std::string_view s) {
  std::vector<iovec> iov{{const_cast<char*>(s.data()), s.size()}};
  return SendAll(link, iov);
}

// One read: <= 0 on EOF, error or timeout.
ssize_t Recv(const Link& link, void* dst, size_t n) {
  if (link.ssl != nullptr) {
    const int r = SSL_read(link.ssl, dst, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    return r > 0 ? r : (SSL_get_error(link.ssl, r) == SSL_ERROR_ZERO_RETURN ? 0 : -1);
  }
  ssize_t got;
  do {
    got = ::recv(link.fd, dst, n, 0);
  } while (got < 0 && errno == EINTR);
  return got;
}

Result<Buffer> ConnBodyReader::ReadAll(uint64_t limit, const Observer& observe) {
  XSILO_RETURN_IF_ERROR(SendContinue());
  if (chunked_) return ReadChunked(limit, observe);
  if (remaining_ > limit) {
    return ResourceExhausted("body of " + std::to_string(remaining_) + " bytes exceeds " +
                             std::to_string(limit));
  }
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(remaining_));
  XSILO_RETURN_IF_ERROR(ReadExact(b.mutable_data(), b.size(), observe));
  remaining_ = 0;
  return b;
}

Status ConnBodyReader::SendContinue() {
  if (!expect_continue_) return Status::OK();
  expect_continue_ = false;
  if (!SendString(conn_.link, "HTTP/1.1 100 Continue\r\n\r\n")) {
    return Unavailable("connection lost sending 100 Continue");
  }
  return Status::OK();
}

Status ConnBodyReader::ReadExact(uint8_t* dst, uint64_t n, const Observer& observe) {
  uint64_t from_buf = std::min<uint64_t>(n, conn_.buffered());
  if (from_buf > 0) {
    std::memcpy(dst, conn_.buf.data() + conn_.start, from_buf);
    conn_.start += from_buf;
    if (observe) observe(dst, from_buf);
    dst += from_buf;
    n -= from_buf;
  }
  while (n > 0) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(n, 1ull << 30));
    ssize_t got = Recv(conn_.link, dst, want);
    if (got <= 0) {
      return Unavailable(got == 0 ? "connection closed mid-body" : "body read failed or timed out");
    }
    if (observe) observe(dst, static_cast<size_t>(got));
    dst += got;
    n -= got;
  }
  return Status::OK();
}

Result<std::string> ConnBodyReader::ReadLine() {
  for (;;) {
    std::string_view unread(conn_.buf.data() + conn_.start, conn_.buffered());
    size_t eol = unread.find("\r\n");
    if (eol != std::string_view::npos) {
      if (eol > max_line_bytes_) break;
      std::string line(unread.substr(0, eol));
      conn_.start += eol + 2;
      return line;
    }
    if (conn_.buffered() > max_line_bytes_) break;
    if (conn_.Fill() <= 0) return Unavailable("connection closed in a chunked body");
  }
  return InvalidArgument("chunked body: line too long");
}

Result<Buffer> ConnBodyReader::ReadChunked(uint64_t limit, const Observer& observe) {
  constexpr uint64_t kBlock = 8ull << 20;
  std::vector<Buffer> blocks;
  uint64_t used = 0;   // bytes in the last block
  uint64_t total = 0;  // bytes of body decoded
  for (;;) {
    XSILO_ASSIGN_OR_RETURN(std::string line, ReadLine());
    std::string_view digits(line);
    if (size_t semi = digits.find(';'); semi != std::string_view::npos) {
      digits = digits.substr(0, semi);
    }
    while (!digits.empty() && (digits.back() == ' ' || digits.back() == '\t')) {
      digits.remove_suffix(1);
    }
    if (digits.empty() || digits.size() > 15) return InvalidArgument("chunked body: bad size");
    uint64_t n = 0;
    for (char ch : digits) {
      int v = HexValue(ch);
      if (v < 0) return InvalidArgument("chunked body: size is not hex");
      n = n * 16 + static_cast<uint64_t>(v);
    }
    if (n == 0) break;
    if (n > limit - total) {
      return ResourceExhausted("chunked body exceeds " + std::to_string(limit) + " bytes");
    }
    while (n > 0) {
      if (blocks.empty() || used == blocks.back().size()) {
        XSILO_ASSIGN_OR_RETURN(Buffer b,
                               Buffer::Allocate(std::min(std::max(n, kBlock), limit - total)));
        blocks.push_back(std::move(b));
        used = 0;
      }
      uint64_t take = std::min(n, blocks.back().size() - used);
      XSILO_RETURN_IF_ERROR(ReadExact(blocks.back().mutable_data() + used, take, observe));
      used += take;
      total += take;
      n -= take;
    }
    XSILO_ASSIGN_OR_RETURN(std::string end, ReadLine());
    if (!end.empty()) return InvalidArgument("chunked body: chunk longer than its size");
  }
  for (size_t fields = 0;; ++fields) {  // trailer section, then an empty line
    XSILO_ASSIGN_OR_RETURN(std::string line, ReadLine());
    if (line.empty()) break;
    if (fields == 64) return InvalidArgument("chunked body: too many trailer fields");
  }
  chunked_done_ = true;
  if (blocks.empty()) return Buffer();
  if (blocks.size() == 1) return blocks.front().SliceUnchecked(0, used);
  XSILO_ASSIGN_OR_RETURN(Buffer joined, Buffer::Allocate(total));
  uint64_t at = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    uint64_t len = i + 1 == blocks.size() ? used : blocks[i].size();
    std::memcpy(joined.mutable_data() + at, blocks[i].data(), len);
    at += len;
  }
  return joined;
}

}  // namespace xsilo::net
