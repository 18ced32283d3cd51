// The client side of the zmq connector: requests to object servers of
// other processes over DEALER sockets.
//
// ZMQ sockets are not thread-safe, so sockets are leased: a call takes an
// idle socket connected to the server's address (or opens one), uses it on
// its own thread, and returns it. A socket that saw any error is closed
// rather than returned, so a late reply to a timed-out request never meets
// the next request.
#pragma once

#include <atomic>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "store/zmq/zmq_protocol.h"
#include "xsilo/core/codec.h"

namespace xsilo::zmq_store {

class RemoteClient {
 public:
  // timeout_ms bounds every wait for a reply frame; chunk_bytes bounds the
  // data frames of a Set.
  RemoteClient(int timeout_ms, uint64_t chunk_bytes);
  ~RemoteClient();
  RemoteClient(const RemoteClient&) = delete;
  RemoteClient& operator=(const RemoteClient&) = delete;

  Result<std::optional<Buffer>> Get(const std::string& address, const std::string& id);
  Result<bool> Exists(const std::string& address, const std::string& id);
  Status Evict(const std::string& address, const std::string& id);
  Status Set(const std::string& address, const std::string& id, const GatherList& bytes);

  // Closes the idle sockets.
  void Close();

 private:
  class Lease;
  Result<void*> Acquire(const std::string& address);
  void Return(const std::string& address, void* socket);

  // Sends a request with no data and receives the first reply message.
  Result<ReplyHeader> Call(void* socket, const std::string& address, Op op, const std::string& id,
                           Frame* data);
  Result<ReplyHeader> Receive(void* socket, const std::string& address, uint64_t request,
                              Frame* data);

  const int timeout_ms_;
  const uint64_t chunk_bytes_;
  std::atomic<uint64_t> next_request_{1};
  std::mutex mu_;
  std::map<std::string, std::vector<void*>> idle_;
};

}  // namespace xsilo::zmq_store
