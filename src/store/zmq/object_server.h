// The zmq connector's object server: this process's objects, kept in
// memory and served to other processes over a ZMQ ROUTER socket by one
// thread.
//
// Servers register by address ("tcp://host:port") in a per-process
// registry, so every zmq connector of the process reaches a local server's
// objects directly, without a network hop, and connectors given the same
// explicit host:port share one server.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "xsilo/core/buffer.h"
#include "xsilo/core/status.h"

namespace xsilo::zmq_store {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                       // 0: an ephemeral port
  uint64_t max_bytes = 0;             // bound on stored bytes; 0: none
  uint64_t chunk_bytes = 1ull << 20;  // largest data frame of a Get reply
  // A Set whose next chunk takes longer than this is abandoned (its client
  // gave up), and the bytes it reserved are released.
  int timeout_ms = 30000;
  // False keeps the server out of the registry, so that connectors of this
  // process reach it over the network like another process would (tests).
  bool register_in_process = true;
};

class ObjectServer {
 public:
  // Binds and starts the serving thread; with an explicit port already
  // served in this process, shares that server. Unavailable when the
  // address cannot be bound.
  static Result<std::shared_ptr<ObjectServer>> Start(const ServerOptions& options);
  // The registered server of this process at `address`, or nullptr.
  static std::shared_ptr<ObjectServer> Find(const std::string& address);

  ~ObjectServer();
  ObjectServer(const ObjectServer&) = delete;
  ObjectServer& operator=(const ObjectServer&) = delete;

  const std::string& address() const { return address_; }
  int port() const { return port_; }

  // Stores (or replaces) an object; ResourceExhausted past max_bytes, in
  // which case nothing is stored.
  Status Store(const std::string& id, Buffer bytes);
  std::optional<Buffer> Lookup(const std::string& id) const;
  bool Contains(const std::string& id) const;
  void Erase(const std::string& id);
  uint64_t stored_bytes() const;
  // Bytes held for Sets still arriving.
  uint64_t reserved_bytes() const;
  // Sets dropped because their next chunk took longer than timeout_ms.
  uint64_t abandoned_sets() const { return abandoned_.load(); }

  // Stops serving and joins the thread (idempotent). Objects stay readable
  // through this object, not through the network.
  void Stop();

 private:
  struct Incoming;  // a Set arriving in chunks
  ObjectServer() = default;

  // Reserves `bytes` against max_bytes (ResourceExhausted when over).
  Status Reserve(uint64_t bytes);
  void Unreserve(uint64_t bytes);
  void Serve();

  ServerOptions options_;
  std::string address_;
  int port_ = 0;
  void* context_ = nullptr;
  void* socket_ = nullptr;
  std::thread thread_;
  std::once_flag stopped_;
  std::atomic<uint64_t> abandoned_{0};

  mutable std::mutex mu_;
  std::map<std::string, Buffer> objects_;
  uint64_t stored_ = 0;    // bytes of objects_
  uint64_t reserved_ = 0;  // bytes of Sets still arriving
};

}  // namespace xsilo::zmq_store
