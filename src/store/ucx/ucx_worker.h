// The ucx connector's UCP machinery: one context, one worker and one
// progress thread per connector, a listener serving this process's objects,
// and client calls to the servers named in keys.
//
// Threading: the worker is created UCS_THREAD_MODE_SINGLE and only the
// progress thread touches it. Public methods post closures to that thread
// (Post wakes it through an eventfd) and wait for their completion with a
// deadline. Every UCP request completes through a callback on the progress
// thread; the state a request writes into (headers, the destination Buffer)
// is owned by shared state the callback holds, so a caller that gave up on
// a deadline leaves nothing dangling.
#pragma once

#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "store/ucx/ucx_object_table.h"
#include "store/ucx/ucx_wire.h"
#include "xsilo/core/buffer.h"
#include "xsilo/core/codec.h"
#include "xsilo/core/status.h"

namespace xsilo::ucx {

struct WorkerOptions {
  std::string tls = "tcp";  // UCX_TLS for this context; empty keeps UCX's own choice
  uint64_t chunk_bytes = 64ull << 20;
  std::chrono::milliseconds timeout{30000};  // longest wait without progress
};

struct CallResult {
  Reply reply;
  Buffer data;  // the body of a found kGet
};

// "host:port" (host may be a bracketed IPv6 address) split in two.
Result<std::pair<std::string, int>> SplitAddress(const std::string& address);

class Worker {
 public:
  static Result<std::unique_ptr<Worker>> Start(const WorkerOptions& options,
                                               std::shared_ptr<ObjectTable> table);
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  // Serves the object table on host:port (0 = an ephemeral port); returns
  // the bound port.
  Result<int> Listen(const std::string& host, int port);
  // One request to the server at "host:port" and its reply. Unavailable when
  // the server cannot be reached or makes no progress for the timeout;
  // Corrupt for a malformed reply.
  Result<CallResult> Call(const std::string& address, const Request& request,
                          const GatherList& body);
  // Stops serving, fails calls in flight, joins the progress thread.
  void Stop();

  // Internal: an endpoint and what runs on it (defined in the .cpp files).
  struct Conn;
  struct ClientCall;

 private:
  explicit Worker(WorkerOptions options, std::shared_ptr<ObjectTable> table);
  Status Init();
  bool Post(std::function<void()> task);
  void Loop();
  void RunTasks();
  void Shutdown();

  // Request helpers: `done` runs on the progress thread exactly once.
  using Done = std::function<void(ucs_status_t)>;
  void Send(const std::shared_ptr<Conn>& conn, const void* data, size_t size, Done done);
  void Recv(const std::shared_ptr<Conn>& conn, void* data, size_t size, Done done);
  // Sends `bytes` in pieces of at most chunk_bytes; `progress` after each
  // piece, `done` after the last.
  void SendBody(const std::shared_ptr<Conn>& conn, const GatherList& bytes,
                std::function<void()> progress, Done done);
  // Receives `size` bytes into `out` in pieces of at most chunk_bytes.
  void RecvBody(const std::shared_ptr<Conn>& conn, uint8_t* out, uint64_t size,
                std::function<void()> progress, Done done);
  std::shared_ptr<Conn> NewConn(std::string address);
  // Takes the endpoint out of use (idempotent) and fails the call using it;
  // the endpoint is closed kRetireGrace later, from the loop.
  void CloseConn(const std::shared_ptr<Conn>& conn, const std::string& why);
  void DestroyEp(const std::shared_ptr<Conn>& conn, ucp_ep_h ep);
  void CloseRetired(bool all);
  static void OnEpError(void* arg, ucp_ep_h ep, ucs_status_t status);

  // Server side (ucx_server.cpp).
  static void OnConnRequest(ucp_conn_request_h request, void* arg);
  void ServeNext(const std::shared_ptr<Conn>& conn);
  void Serve(const std::shared_ptr<Conn>& conn, const Request& request);
  void Answer(const std::shared_ptr<Conn>& conn, Reply reply, GatherList body);
  void DiscardBody(const std::shared_ptr<Conn>& conn, uint64_t remaining, Done done);

  // Client side (ucx_client.cpp).
  void StartCall(const std::shared_ptr<ClientCall>& call);
  void OnReply(const std::shared_ptr<ClientCall>& call);
  void FinishCall(const std::shared_ptr<ClientCall>& call, Status status);

  const WorkerOptions options_;
  const std::shared_ptr<ObjectTable> table_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  ucp_listener_h listener_ = nullptr;
  int wake_fd_ = -1;
  std::thread thread_;
  std::mutex join_mu_;  // Stop may be called from several threads

  std::mutex mu_;  // guards tasks_, stopping_
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::atomic<bool> stopped_{false};

  // Progress thread only.
  std::set<std::shared_ptr<Conn>> conns_;
  std::map<std::string, std::vector<std::shared_ptr<Conn>>> idle_;
  static constexpr std::chrono::seconds kRetireGrace{1};  // see CloseConn
  std::deque<std::pair<std::chrono::steady_clock::time_point, std::shared_ptr<Conn>>> retiring_;
  std::vector<uint8_t> scratch_;  // 1 MiB, never resized: where a refused kSet body is drained
};

}  // namespace xsilo::ucx
