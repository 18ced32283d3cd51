#include "net/http_client.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstring>

namespace xsilo::net {

namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r'))
    s.remove_suffix(1);
  return std::string(s);
}

// Reads a response head (after `have`, bytes already received); bytes
// after it stay in *rest.
Status ReadHead(int fd, std::string* head, std::string* rest, std::string have) {
  std::string buf = std::move(have);
  char chunk[16384];
  while (true) {
    auto end = buf.find("\r\n\r\n");
    if (end != std::string::npos) {
      *head = buf.substr(0, end);
      *rest = buf.substr(end + 4);
      return Status::OK();
    }
    if (buf.size() > (64u << 10)) return Corrupt("endpoint reply head over 64 KiB");
    ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n == 0) return Unavailable("endpoint closed the connection before replying");
    if (n < 0) return Unavailable(std::string("endpoint reply: ") + std::strerror(errno));
    buf.append(chunk, static_cast<size_t>(n));
  }
}

}  // namespace

Result<HttpReply> HttpCall(const HostPort& server, const std::string& method,
                           const std::string& target, const GatherList* body,
                           std::chrono::milliseconds timeout, const std::string& token) {
  XSILO_ASSIGN_OR_RETURN(int fd, ConnectTcp(server, timeout, timeout));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  // A body waits for "100 Continue": an endpoint that refuses the put
  // (507: past its bound) answers before any of it is sent, instead of
  // closing on an unread body (which could reset the connection before
  // its answer is read).
  std::string req = method + " " + target + " HTTP/1.1\r\nHost: " + server.ToString() +
                    "\r\nConnection: close\r\n";
  if (!token.empty()) req += "Authorization: Bearer " + token + "\r\n";
  if (body) {
    req += "Content-Length: " + std::to_string(body->size) + "\r\n";
    if (body->size > 0) req += "Expect: 100-continue\r\n";
  }
  req += "\r\n";
  XSILO_RETURN_IF_ERROR(SendAll(fd, req.data(), req.size()));
  std::string head, rest;
  XSILO_RETURN_IF_ERROR(ReadHead(fd, &head, &rest, ""));
  if (body && body->size > 0 && head.compare(0, 12, "HTTP/1.1 100") == 0) {
    XSILO_RETURN_IF_ERROR(SendGather(fd, *body));
    XSILO_RETURN_IF_ERROR(ReadHead(fd, &head, &rest, rest));
  }
  HttpReply reply;
  size_t line_end = head.find("\r\n");
  std::string status_line = head.substr(0, line_end);
  if (status_line.size() < 12 || status_line.compare(0, 5, "HTTP/") != 0) {
    return Corrupt("endpoint reply has a bad status line: " + status_line);
  }
  reply.status = std::atoi(status_line.c_str() + 9);
  size_t pos = line_end == std::string::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    size_t e = head.find("\r\n", pos);
    if (e == std::string::npos) e = head.size();
    std::string_view line(head.data() + pos, e - pos);
    auto colon = line.find(':');
    if (colon != std::string_view::npos) {
      reply.headers[Lower(std::string(line.substr(0, colon)))] = Trim(line.substr(colon + 1));
    }
    pos = e + 2;
  }
  auto cl = reply.headers.find("content-length");
  if (cl == reply.headers.end()) return Corrupt("endpoint reply has no Content-Length");
  auto [p, ec] = std::from_chars(cl->second.data(), cl->second.data() + cl->second.size(),
                                 reply.content_length);
  if (ec != std::errc()) return Corrupt("endpoint reply has a bad Content-Length");
  if (method == "HEAD") return reply;
  const uint64_t len = reply.content_length;
  XSILO_ASSIGN_OR_RETURN(reply.body, Buffer::Allocate(len));
  uint64_t have = std::min<uint64_t>(rest.size(), len);
  if (have > 0)
    std::memcpy(reply.body.mutable_data(), rest.data(), have);  // an empty body has no storage
  while (have < len) {
    size_t want = static_cast<size_t>(std::min<uint64_t>(len - have, 1u << 30));
    ssize_t n = ::recv(fd, reply.body.mutable_data() + have, want, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return Unavailable("endpoint reply broke after " + std::to_string(have) + " of " +
                         std::to_string(len) + " bytes");
    }
    have += static_cast<uint64_t>(n);
  }
  return reply;
}

Status StatusOfReply(const HttpReply& reply, const std::string& what) {
  std::string msg = what + ": HTTP " + std::to_string(reply.status);
  if (!reply.body.empty()) msg += ": " + std::string(reply.body.view());
  switch (reply.status) {
    case 400:
      return InvalidArgument(msg);
    case 401:
      return Unauthenticated(msg);
    case 403:
      return PermissionDenied(msg);
    case 404:
      return NotFound(msg);
    case 413:
    case 507:
      return ResourceExhausted(msg);
    case 502:
    case 503:
    case 504:
      return Unavailable(msg);
    default:
      return Internal(msg);
  }
}

}  // namespace xsilo::net
