// Private types shared by ucx_worker.cpp, ucx_server.cpp and ucx_client.cpp.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <utility>

#include "store/ucx/ucx_worker.h"

namespace xsilo::ucx {

struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int port() const {
    if (storage.ss_family == AF_INET6) {
      return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
    }
    return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  }
};

std::string StatusText(ucs_status_t status);
Result<SocketAddress> ResolveAddress(const std::string& host, int port);

struct Worker::Conn : std::enable_shared_from_this<Conn> {
  Worker* worker = nullptr;
  ucp_ep_h ep = nullptr;           // null once closed
  bool closing = false;            // ucp_ep_close_nbx still pending
  ucp_ep_h retired_ep = nullptr;   // failed, to be closed after a grace
  std::string address;             // the peer server's host:port (client side)
  std::weak_ptr<ClientCall> call;  // client side: the call using the endpoint
  RequestBytes request{};          // server side: the request being read
};

struct Worker::ClientCall {
  std::string address;
  SocketAddress addr;
  Op op = Op::kGet;
  RequestBytes request{};
  GatherList body;
  ReplyBytes reply_bytes{};
  CallResult result;
  // Progress thread only.
  std::shared_ptr<Conn> conn;
  bool finished = false;
  bool sent = false;
  bool replied = false;
  // Shared with the caller.
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;
  std::atomic<int64_t> last_progress_ns{0};

  void Touch() {
    last_progress_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                           std::chrono::steady_clock::now().time_since_epoch())
                           .count();
  }
};

}  // namespace xsilo::ucx
