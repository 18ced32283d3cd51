// Net layer: blocking TCP helpers with timeouts, shared by the endpoint
// connector (src/store/endpoint), the endpoint and the relay (src/endpoint).
// Every call that can block is bounded: connect by its own timeout, each
// send/recv by the socket's SO_SNDTIMEO/SO_RCVTIMEO (SetIoTimeout).
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>

#include "xsilo/core/codec.h"
#include "xsilo/core/status.h"

namespace xsilo::net {

struct HostPort {
  std::string host;
  int port = 0;
  std::string ToString() const { return host + ":" + std::to_string(port); }
};

// "host:port" or "[v6]:port"; port 0..65535.
Result<HostPort> ParseHostPort(std::string_view text);

// A connected TCP socket (TCP_NODELAY, io timeout set), or Unavailable when
// no address of `hp` accepts within connect_timeout.
Result<int> ConnectTcp(const HostPort& hp, std::chrono::milliseconds connect_timeout,
                       std::chrono::milliseconds io_timeout);
// A listening socket bound to hp (port 0: ephemeral); *bound_port gets the port.
Result<int> ListenTcp(const HostPort& hp, int* bound_port);

void SetIoTimeout(int fd, std::chrono::milliseconds timeout);

// A UDP socket bound to hp, with a 200 ms receive timeout (a loop that
// reads it looks at its stop flag that often).
Result<int> BindUdp(const HostPort& hp);

// Whole writes / reads on a plain socket; Unavailable when the peer is gone
// or a send/recv timed out.
Status SendAll(int fd, const void* data, size_t n);
Status SendGather(int fd, const GatherList& bytes);
Status RecvExact(int fd, void* data, size_t n);

// Closes fd if >= 0 and sets it to -1.
void CloseFd(int& fd);

}  // namespace xsilo::net
