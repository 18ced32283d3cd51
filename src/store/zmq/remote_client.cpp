#include "store/zmq/remote_client.h"

#include <cerrno>
#include <cstring>

namespace xsilo::zmq_store {

namespace {

// The context of every client socket in the process. Never terminated:
// zmq_ctx_term would wait for sockets still open at exit.
void* ClientContext() {
  static void* context = zmq_ctx_new();
  return context;
}

constexpr size_t kIdlePerAddress = 8;
// Chunks of a Set sent ahead of their acknowledgements.
constexpr int kWindow = 16;

}  // namespace

// A socket taken from the pool; closed unless released healthy.
class RemoteClient::Lease {
 public:
  Lease(RemoteClient* owner, std::string address, void* socket)
      : owner_(owner), address_(std::move(address)), socket_(socket) {}
  ~Lease() {
    if (socket_) zmq_close(socket_);
  }
  void* get() const { return socket_; }
  void Keep() {
    owner_->Return(address_, socket_);
    socket_ = nullptr;
  }

 private:
  RemoteClient* owner_;
  std::string address_;
  void* socket_;
};

RemoteClient::RemoteClient(int timeout_ms, uint64_t chunk_bytes)
    : timeout_ms_(timeout_ms), chunk_bytes_(chunk_bytes) {}

RemoteClient::~RemoteClient() { Close(); }

void RemoteClient::Close() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [address, sockets] : idle_) {
    for (void* s : sockets) zmq_close(s);
  }
  idle_.clear();
}

Result<void*> RemoteClient::Acquire(const std::string& address) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = idle_.find(address);
    if (it != idle_.end() && !it->second.empty()) {
      void* s = it->second.back();
      it->second.pop_back();
      return s;
    }
  }
  void* s = zmq_socket(ClientContext(), ZMQ_DEALER);
  if (!s) return Internal(ZmqError("zmq_socket"));
  int zero = 0, one = 1, rcvhwm = 16;
  zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof zero);
  // Chunks of a Set reference the caller's Buffers: queueing them costs no copies.
  zmq_setsockopt(s, ZMQ_SNDHWM, &zero, sizeof zero);
  zmq_setsockopt(s, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
  if (address.find('[') != std::string::npos) zmq_setsockopt(s, ZMQ_IPV6, &one, sizeof one);
  if (zmq_connect(s, address.c_str()) != 0) {
    Status err =
        Unavailable("zmq connector cannot connect to " + address + ": " + zmq_strerror(errno));
    zmq_close(s);
    return err;
  }
  return s;
}

void RemoteClient::Return(const std::string& address, void* socket) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& idle = idle_[address];
  if (idle.size() < kIdlePerAddress) {
    idle.push_back(socket);
  } else {
    zmq_close(socket);
  }
}

Result<ReplyHeader> RemoteClient::Receive(void* socket, const std::string& address,
                                          uint64_t request, Frame* data) {
  zmq_pollitem_t item{socket, 0, ZMQ_POLLIN, 0};
  int ready;
  do {
    ready = zmq_poll(&item, 1, timeout_ms_);
  } while (ready < 0 && errno == EINTR);
  if (ready < 0) return Unavailable(ZmqError(("zmq poll for " + address).c_str()));
  if (ready == 0) {
    return Unavailable("no reply from zmq server " + address + " within " +
                       std::to_string(timeout_ms_) + " ms");
  }
  // The frames of one message arrive together, so none of these waits.
  Frame header;
  if (zmq_msg_recv(header.get(), socket, ZMQ_DONTWAIT) < 0) {
    return Unavailable(ZmqError(("zmq receive from " + address).c_str()));
  }
  if (!header.more() || zmq_msg_recv(data->get(), socket, ZMQ_DONTWAIT) < 0 || data->more()) {
    return Corrupt("zmq server " + address + " sent a reply that is not two frames");
  }
  auto h = DecodeReply(header.view());
  if (!h) return Corrupt("zmq server " + address + " sent a malformed reply header");
  if (h->request != request) {
    return Corrupt("zmq server " + address + " answered request " + std::to_string(h->request) +
                   ", expected " + std::to_string(request));
  }
  if (h->kind == ReplyKind::kError) {
    std::string message(data->view());
    if (h->code == StatusCode::kOk) return Corrupt("zmq server " + address + ": " + message);
    return Status(h->code, message);
  }
  return *h;
}

Result<ReplyHeader> RemoteClient::Call(void* socket, const std::string& address, Op op,
                                       const std::string& id, Frame* data) {
  uint64_t request = next_request_++;
  if (SendCopy(socket, EncodeRequest({op, request, 0, 0, id}), ZMQ_SNDMORE) != 0 ||
      SendCopy(socket, {}, 0) != 0) {
    return Unavailable(ZmqError(("zmq send to " + address).c_str()));
  }
  return Receive(socket, address, request, data);
}

Result<std::optional<Buffer>> RemoteClient::Get(const std::string& address, const std::string& id) {
  XSILO_ASSIGN_OR_RETURN(void* raw, Acquire(address));
  Lease lease(this, address, raw);
  Frame first;
  XSILO_ASSIGN_OR_RETURN(ReplyHeader h, Call(raw, address, Op::kGet, id, &first));
  const uint64_t request = h.request;
  if (h.kind == ReplyKind::kMissing) {
    lease.Keep();
    return std::optional<Buffer>();
  }
  const uint64_t total = h.total;
  XSILO_ASSIGN_OR_RETURN(Buffer out, Buffer::Allocate(total));
  uint64_t received = 0;
  Frame next;
  Frame* data = &first;
  for (;;) {
    uint64_t n = data->size();
    if (h.kind != ReplyKind::kFound || h.total != total || h.offset != received ||
        n > total - received || (n == 0 && total != 0)) {
      return Corrupt("zmq server " + address + " sent a bad chunk of " + id + " (offset " +
                     std::to_string(h.offset) + ", " + std::to_string(n) + " bytes, after " +
                     std::to_string(received) + " of " + std::to_string(total) + ")");
    }
    // libzmq received the frame into its own memory; this is the one copy.
    if (n > 0) std::memcpy(out.mutable_data() + received, data->view().data(), n);
    received += n;
    if (received == total) break;
    Frame* fresh = data == &first ? &next : &first;
    zmq_msg_close(fresh->get());
    zmq_msg_init(fresh->get());
    XSILO_ASSIGN_OR_RETURN(h, Receive(raw, address, request, fresh));
    data = fresh;
  }
  lease.Keep();
  return std::optional<Buffer>(std::move(out));
}

Result<bool> RemoteClient::Exists(const std::string& address, const std::string& id) {
  XSILO_ASSIGN_OR_RETURN(void* raw, Acquire(address));
  Lease lease(this, address, raw);
  Frame data;
  XSILO_ASSIGN_OR_RETURN(ReplyHeader h, Call(raw, address, Op::kExists, id, &data));
  lease.Keep();
  return h.kind == ReplyKind::kFound;
}

Status RemoteClient::Evict(const std::string& address, const std::string& id) {
  XSILO_ASSIGN_OR_RETURN(void* raw, Acquire(address));
  Lease lease(this, address, raw);
  Frame data;
  XSILO_ASSIGN_OR_RETURN(ReplyHeader h, Call(raw, address, Op::kEvict, id, &data));
  if (h.kind != ReplyKind::kFound) return Corrupt("zmq server " + address + ": bad evict reply");
  lease.Keep();
  return Status::OK();
}

Status RemoteClient::Set(const std::string& address, const std::string& id,
                         const GatherList& bytes) {
  uint64_t sum = 0;
  for (const Buffer& segment : bytes.segments) sum += segment.size();
  if (sum != bytes.size) {
    return InvalidArgument("gather list of " + std::to_string(sum) + " bytes claims " +
                           std::to_string(bytes.size));
  }
  XSILO_ASSIGN_OR_RETURN(void* raw, Acquire(address));
  Lease lease(this, address, raw);
  uint64_t request = next_request_++;
  auto send = [&](uint64_t offset, const Buffer& chunk) -> Status {
    if (SendCopy(raw, EncodeRequest({Op::kSet, request, bytes.size, offset, id}), ZMQ_SNDMORE) !=
            0 ||
        SendBuffer(raw, chunk, 0) != 0) {
      return Unavailable(ZmqError(("zmq send to " + address).c_str()));
    }
    return Status::OK();
  };
  // The server acknowledges every chunk; at most kWindow chunks are in
  // flight, so a transfer that stalls fails after timeout_ms however large
  // the object. The last acknowledgement (offset == total) is the commit.
  int in_flight = 0;
  uint64_t acknowledged_through = 0;
  auto acknowledged = [&]() -> Status {
    Frame data;
    XSILO_ASSIGN_OR_RETURN(ReplyHeader h, Receive(raw, address, request, &data));
    if (h.kind != ReplyKind::kFound || h.total != bytes.size || h.offset > bytes.size) {
      return Corrupt("zmq server " + address + " sent a bad acknowledgement for " + id);
    }
    --in_flight;
    acknowledged_through = h.offset;
    return Status::OK();
  };
  // Chunks never span segments, so every one is sent without a copy.
  uint64_t offset = 0;
  for (const Buffer& segment : bytes.segments) {
    for (uint64_t at = 0; at < segment.size();) {
      if (in_flight == kWindow) XSILO_RETURN_IF_ERROR(acknowledged());
      uint64_t n = std::min(chunk_bytes_, segment.size() - at);
      XSILO_RETURN_IF_ERROR(send(offset, segment.SliceUnchecked(at, n)));
      ++in_flight;
      at += n;
      offset += n;
    }
  }
  if (bytes.size == 0) {
    XSILO_RETURN_IF_ERROR(send(0, Buffer()));
    ++in_flight;
  }
  while (in_flight > 0) XSILO_RETURN_IF_ERROR(acknowledged());
  if (acknowledged_through != bytes.size) {
    return Corrupt("zmq server " + address + " acknowledged " +
                   std::to_string(acknowledged_through) + " of " + std::to_string(bytes.size) +
                   " bytes of " + id + " as the whole object");
  }
  lease.Keep();
  return Status::OK();
}

}  // namespace xsilo::zmq_store
