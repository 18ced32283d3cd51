// The client side of the ucx connector: a call takes an idle endpoint to
// its server (or connects one), sends the request, and receives the reply
// into the final Buffer.
#include <cstring>

#include "store/ucx/ucx_internal.h"

namespace xsilo::ucx {

namespace {

constexpr size_t kMaxIdlePerServer = 16;

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<CallResult> Worker::Call(const std::string& address, const Request& request,
                                const GatherList& body) {
  XSILO_ASSIGN_OR_RETURN(auto host_port, SplitAddress(address));
  XSILO_ASSIGN_OR_RETURN(SocketAddress addr, ResolveAddress(host_port.first, host_port.second));
  auto call = std::make_shared<ClientCall>();
  call->address = address;
  call->addr = addr;
  call->op = request.op;
  call->request = EncodeRequest(request);
  call->body = body;
  call->Touch();
  if (!Post([this, call] { StartCall(call); })) return Unavailable("ucx connector closed");
  const int64_t timeout_ns =
      std::chrono::duration_cast<std::chrono::nanoseconds>(options_.timeout).count();
  std::unique_lock<std::mutex> lock(call->mu);
  while (!call->done) {
    int64_t idle = NowNs() - call->last_progress_ns.load();
    if (idle >= timeout_ns) {
      lock.unlock();
      Status s = Unavailable("ucx: no progress from " + address + " for " +
                             std::to_string(options_.timeout.count()) + " ms");
      Post([this, call, s] { FinishCall(call, s); });
      return s;
    }
    call->cv.wait_for(lock, std::chrono::nanoseconds(timeout_ns - idle));
  }
  if (!call->status.ok()) return call->status;
  return std::move(call->result);
}

void Worker::StartCall(const std::shared_ptr<ClientCall>& call) {
  // Posted just before Stop: the worker is shutting down.
  if (stopped_) return FinishCall(call, Unavailable("ucx connector closed"));
  std::shared_ptr<Conn> conn;
  auto& idle = idle_[call->address];
  while (!idle.empty() && !conn) {
    conn = std::move(idle.back());
    idle.pop_back();
    if (!conn->ep) conn.reset();
  }
  if (!conn) {
    conn = NewConn(call->address);
    ucp_ep_params_t params{};
    params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                        UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE | UCP_EP_PARAM_FIELD_ERR_HANDLER;
    params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&call->addr.storage);
    params.sockaddr.addrlen = call->addr.length;
    params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    params.err_handler.cb = &Worker::OnEpError;
    params.err_handler.arg = conn.get();
    ucs_status_t st = ucp_ep_create(worker_, &params, &conn->ep);
    if (st != UCS_OK) {
      conn->ep = nullptr;
      conns_.erase(conn);
      return FinishCall(
          call, Unavailable("ucx: cannot connect to " + call->address + ": " + StatusText(st)));
    }
  }
  conn->call = call;
  call->conn = conn;
  auto failed = [this, call](const char* what) {
    return [this, call, what](ucs_status_t st) {
      if (st != UCS_OK) {
        FinishCall(call, Unavailable(std::string("ucx: ") + what + " " + call->address + ": " +
                                     StatusText(st)));
      }
    };
  };
  Send(conn, call->request.data(), call->request.size(), failed("sending a request to"));
  if (call->body.size > 0) {
    SendBody(
        conn, call->body, [call] { call->Touch(); },
        [this, call, failed](ucs_status_t st) {
          if (st != UCS_OK) return failed("sending an object to")(st);
          call->Touch();
          call->sent = true;
          if (call->replied) FinishCall(call, Status::OK());
        });
  } else {
    call->sent = true;
  }
  Recv(conn, call->reply_bytes.data(), call->reply_bytes.size(),
       [this, call, failed](ucs_status_t st) {
         if (st != UCS_OK) return failed("no reply from")(st);
         call->Touch();
         OnReply(call);
       });
}

void Worker::OnReply(const std::shared_ptr<ClientCall>& call) {
  if (call->finished) return;
  std::optional<Reply> reply = DecodeReply(call->reply_bytes);
  if (!reply) return FinishCall(call, Corrupt("ucx: malformed reply from " + call->address));
  call->result.reply = *reply;
  auto complete = [this, call] {
    call->replied = true;
    if (call->sent) FinishCall(call, Status::OK());
  };
  if (call->op != Op::kGet || reply->status != ReplyStatus::kOk || reply->size == 0) {
    return complete();
  }
  Result<Buffer> data = Buffer::Allocate(reply->size);
  if (!data.ok()) return FinishCall(call, data.status());
  Buffer dest = *data;
  call->result.data = dest;
  // `dest` rides along until the last piece completes, even if the caller
  // gave up on the call.
  RecvBody(
      call->conn, dest.mutable_data(), dest.size(), [call] { call->Touch(); },
      [this, call, complete, dest](ucs_status_t st) {
        if (st != UCS_OK) {
          return FinishCall(call, Unavailable("ucx: receiving an object from " + call->address +
                                              ": " + StatusText(st)));
        }
        complete();
      });
}

void Worker::FinishCall(const std::shared_ptr<ClientCall>& call, Status status) {
  if (call->finished) return;
  call->finished = true;
  std::shared_ptr<Conn> conn = std::move(call->conn);
  if (conn) {
    conn->call.reset();
    if (status.ok() && conn->ep) {
      auto& idle = idle_[conn->address];
      if (idle.size() < kMaxIdlePerServer) {
        idle.push_back(conn);
      } else {
        CloseConn(conn, "too many idle endpoints");
      }
    } else {
      // The stream may hold the rest of a reply: the endpoint is not reused.
      CloseConn(conn, status.message());
    }
  }
  {
    std::lock_guard<std::mutex> lock(call->mu);
    call->done = true;
    call->status = std::move(status);
  }
  call->cv.notify_all();
}

}  // namespace xsilo::ucx
