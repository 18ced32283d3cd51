// Net layer: the endpoint connector's HTTP/1.1 client for the local endpoint's
// API (plain HTTP on loopback). One connection per call ("Connection:
// close"): calls are independent, so any number of threads call at once.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "net/socket.h"
#include "xsilo/core/buffer.h"

namespace xsilo::net {

struct HttpReply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lowercased
  Buffer body;                                 // empty for HEAD
  uint64_t content_length = 0;
};

// `body` may be null (no body). `token`, when not empty, is sent as
// "Authorization: Bearer <token>" (the endpoint's local API token).
// Unavailable when the endpoint cannot be reached or the connection breaks
// before the whole reply arrived.
Result<HttpReply> HttpCall(const HostPort& server, const std::string& method,
                           const std::string& target, const GatherList* body,
                           std::chrono::milliseconds timeout, const std::string& token = "");

// Maps an error reply to a Status (its body is the message).
Status StatusOfReply(const HttpReply& reply, const std::string& what);

}  // namespace xsilo::net
