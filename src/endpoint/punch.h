// Private: a hole-punched path between two endpoints behind NATs
// (docs/endpoint.md "Paths"). ICE (libnice, RFC 5245) gathers each side's
// candidates (host, and server-reflexive from a STUN server: the relay's
// UDP port), checks every pair both ways, which opens the NATs' mappings,
// and keeps one that works; libnice's pseudo-TCP runs a reliable byte
// stream over that UDP pair. The stream is bridged to one end of a
// socketpair, so the TLS session runs on a file descriptor exactly as on
// the direct and relayed paths.
//
// Threads (per path): one runs the GLib main loop of the ICE agent, whose
// receive callback writes the peer's bytes into the socketpair; once
// connected, one more pumps the local side's bytes onto the stream. The
// loop ends, and the agent is freed, once the local side finished and the
// peer went silent (punch.cpp, Link::OnTick).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "xsilo/core/status.h"

namespace xsilo::endpoint {

struct PunchOptions {
  std::string stun_host;  // an IPv4/IPv6 address or a name resolved here
  int stun_port = 0;
  bool controlling = false;                        // the requester controls ICE
  std::chrono::milliseconds gather_timeout{3000};  // candidates, including the STUN answer
  // ICE checks; then, once more, the stream's handshake on the pair found.
  std::chrono::milliseconds connect_timeout{5000};
  std::chrono::milliseconds io_timeout{60000};  // a direction with no byte for this long ends
};

class PunchedPath {
 public:
  // Creates the ICE agent and gathers this side's candidates.
  static Result<std::unique_ptr<PunchedPath>> Gather(PunchOptions o);
  ~PunchedPath();

  // This side's credentials and candidates: one token (hex of the SDP), to
  // be passed to the peer through the relay.
  const std::string& description() const { return description_; }

  // Takes the peer's description, runs the checks and waits for the stream
  // to be writable: a socket carrying the stream (the caller closes it), or
  // Unavailable, naming what the agent did, when no pair worked within
  // connect_timeout or the stream's handshake did not finish within another
  // connect_timeout after it.
  Result<int> Connect(const std::string& remote_description);

  struct Link;

 private:
  explicit PunchedPath(std::shared_ptr<Link> link) : link_(std::move(link)) {}
  std::shared_ptr<Link> link_;
  std::string description_;
  bool reflexive_ = false;  // this side gathered a server-reflexive candidate
  int fd_ = -1;             // the caller's end of the socketpair, until Connect hands it out
};

// A STUN (RFC 5389) Binding responder: answers each Binding request in
// `request` from `from` (a sockaddr of from_len bytes) with the reflexive
// address, FINGERPRINT included. Returns the response, or "" for anything
// that is not a well-formed Binding request.
std::string StunBindingResponse(const std::string& request, const void* from, size_t from_len);

}  // namespace xsilo::endpoint
