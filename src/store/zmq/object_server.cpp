#include "store/zmq/object_server.h"

#include <zmq.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "store/zmq/zmq_protocol.h"

namespace xsilo::zmq_store {

namespace {

// Servers of this process by address. Leaked on purpose: servers may stop
// during static destruction.
std::mutex& RegistryMutex() {
  static auto* mu = new std::mutex;
  return *mu;
}
std::map<std::string, std::weak_ptr<ObjectServer>>& Registry() {
  static auto* registry = new std::map<std::string, std::weak_ptr<ObjectServer>>;
  return *registry;
}

std::string BytesText(uint64_t n) { return std::to_string(n) + " bytes"; }

}  // namespace

struct ObjectServer::Incoming {
  std::string id;
  uint64_t total = 0;
  uint64_t received = 0;
  bool reserved = false;
  Buffer bytes;
  Status error;
  std::chrono::steady_clock::time_point last_chunk;
};

Result<std::shared_ptr<ObjectServer>> ObjectServer::Start(const ServerOptions& options) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  if (options.port != 0 && options.register_in_process) {
    auto it = Registry().find(TcpAddress(options.host, options.port));
    if (it != Registry().end()) {
      if (auto shared = it->second.lock()) return shared;
    }
  }
  std::shared_ptr<ObjectServer> s(new ObjectServer);
  s->options_ = options;
  s->context_ = zmq_ctx_new();
  if (!s->context_) return Internal(ZmqError("zmq_ctx_new"));
  s->socket_ = zmq_socket(s->context_, ZMQ_ROUTER);
  if (!s->socket_) {
    zmq_ctx_term(s->context_);
    s->context_ = nullptr;
    return Internal(ZmqError("zmq_socket"));
  }
  int zero = 0, one = 1, rcvhwm = 16;
  zmq_setsockopt(s->socket_, ZMQ_LINGER, &zero, sizeof zero);
  // A reply to a client that went away fails instead of blocking; replies
  // reference stored Buffers, so an unbounded send queue costs no copies.
  zmq_setsockopt(s->socket_, ZMQ_ROUTER_MANDATORY, &one, sizeof one);
  zmq_setsockopt(s->socket_, ZMQ_SNDHWM, &zero, sizeof zero);
  // Few chunks of an arriving Set wait in libzmq: TCP pushes back instead.
  zmq_setsockopt(s->socket_, ZMQ_RCVHWM, &rcvhwm, sizeof rcvhwm);
  if (options.host.find(':') != std::string::npos) {
    zmq_setsockopt(s->socket_, ZMQ_IPV6, &one, sizeof one);
  }
  // "tcp://host:*" binds an ephemeral port.
  std::string endpoint = TcpAddress(options.host, options.port == 0 ? 1 : options.port);
  if (options.port == 0) endpoint = endpoint.substr(0, endpoint.rfind(':')) + ":*";
  if (zmq_bind(s->socket_, endpoint.c_str()) != 0) {
    Status err = Unavailable("zmq connector cannot bind " + endpoint + ": " + zmq_strerror(errno));
    zmq_close(s->socket_);
    zmq_ctx_term(s->context_);
    s->socket_ = s->context_ = nullptr;
    return err;
  }
  char last[256] = {};
  size_t len = sizeof last;
  zmq_getsockopt(s->socket_, ZMQ_LAST_ENDPOINT, last, &len);
  std::string bound(last);
  s->port_ = std::atoi(bound.substr(bound.rfind(':') + 1).c_str());
  s->address_ = TcpAddress(options.host, s->port_);
  s->thread_ = std::thread([raw = s.get()] { raw->Serve(); });
  if (options.register_in_process) Registry()[s->address_] = s;
  return s;
}

std::shared_ptr<ObjectServer> ObjectServer::Find(const std::string& address) {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  auto it = Registry().find(address);
  return it == Registry().end() ? nullptr : it->second.lock();
}

ObjectServer::~ObjectServer() { Stop(); }

void ObjectServer::Stop() {
  std::call_once(stopped_, [this] {
    if (options_.register_in_process && !address_.empty()) {
      std::lock_guard<std::mutex> lock(RegistryMutex());
      auto it = Registry().find(address_);
      if (it != Registry().end()) {
        auto owner = it->second.lock();
        if (!owner || owner.get() == this) Registry().erase(it);
      }
    }
    if (!context_) return;
    // Blocking calls of the serving thread return ETERM; it closes its socket.
    zmq_ctx_shutdown(context_);
    if (thread_.joinable()) thread_.join();
    zmq_ctx_term(context_);
    context_ = nullptr;
  });
}

Status ObjectServer::Store(const std::string& id, Buffer bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(id);
  uint64_t old = it == objects_.end() ? 0 : it->second.size();
  if (options_.max_bytes != 0 && stored_ - old + reserved_ + bytes.size() > options_.max_bytes) {
    return ResourceExhausted("zmq server " + address_ + ": storing " + BytesText(bytes.size()) +
                             " would exceed max_bytes=" + std::to_string(options_.max_bytes) +
                             " (" + BytesText(stored_ + reserved_) + " in use)");
  }
  stored_ = stored_ - old + bytes.size();
  objects_[id] = std::move(bytes);
  return Status::OK();
}

std::optional<Buffer> ObjectServer::Lookup(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(id);
  if (it == objects_.end()) return std::nullopt;
  return it->second;
}

bool ObjectServer::Contains(const std::string& id) const {
  std::lock_guard<std::mutex> lock(mu_);
  return objects_.count(id) > 0;
}

void ObjectServer::Erase(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = objects_.find(id);
  if (it == objects_.end()) return;
  stored_ -= it->second.size();
  objects_.erase(it);
}

uint64_t ObjectServer::stored_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stored_;
}

uint64_t ObjectServer::reserved_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reserved_;
}

Status ObjectServer::Reserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (options_.max_bytes != 0 && stored_ + reserved_ + bytes > options_.max_bytes) {
    return ResourceExhausted("zmq server " + address_ + ": storing " + BytesText(bytes) +
                             " would exceed max_bytes=" + std::to_string(options_.max_bytes) +
                             " (" + BytesText(stored_ + reserved_) + " in use)");
  }
  reserved_ += bytes;
  return Status::OK();
}

void ObjectServer::Unreserve(uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  reserved_ -= bytes;
}

void ObjectServer::Serve() {
  // Sets still arriving, by (client routing id, request number).
  std::map<std::pair<std::string, uint64_t>, Incoming> incoming;
  const auto abandon_after = std::chrono::milliseconds(options_.timeout_ms);
  for (;;) {
    if (!incoming.empty()) {
      zmq_pollitem_t item{socket_, 0, ZMQ_POLLIN, 0};
      int ready = zmq_poll(&item, 1, std::min(options_.timeout_ms, 1000));
      if (ready < 0 && errno == EINTR) continue;
      if (ready < 0) break;  // ETERM: Stop()
      auto now = std::chrono::steady_clock::now();
      for (auto it = incoming.begin(); it != incoming.end();) {
        if (now - it->second.last_chunk <= abandon_after) {
          ++it;
          continue;
        }
        if (it->second.reserved) Unreserve(it->second.total);
        it = incoming.erase(it);
        ++abandoned_;
      }
      if (ready == 0) continue;
    }
    Frame peer;
    if (zmq_msg_recv(peer.get(), socket_, 0) < 0) {
      if (errno == EINTR) continue;
      break;  // ETERM: Stop()
    }
    Frame header, data;
    bool has_header = peer.more() && zmq_msg_recv(header.get(), socket_, 0) >= 0;
    bool has_data = has_header && header.more() && zmq_msg_recv(data.get(), socket_, 0) >= 0;
    bool extra = has_data && data.more();
    while (extra) {  // more frames than the protocol has: drop them
      Frame rest;
      if (zmq_msg_recv(rest.get(), socket_, 0) < 0) break;
      extra = rest.more();
    }
    std::optional<RequestHeader> h;
    if (has_data && !extra) h = DecodeRequest(header.view());
    std::string to(peer.view());

    auto reply = [&](ReplyHeader r, const Buffer& body) {
      // A client that went away (EHOSTUNREACH) just misses its reply.
      if (SendCopy(socket_, to, ZMQ_SNDMORE) != 0) return false;
      if (SendCopy(socket_, EncodeReply(r), ZMQ_SNDMORE) != 0) return false;
      return SendBuffer(socket_, body, 0) == 0;
    };
    auto reply_status = [&](uint64_t request, const Status& s) {
      ReplyHeader r{ReplyKind::kError, s.code(), request, 0, 0};
      reply(r, Buffer::CopyFrom(s.message()));
    };

    if (!h) {
      reply_status(0, Corrupt("zmq server " + address_ + ": malformed request"));
      continue;
    }
    switch (h->op) {
      case Op::kGet: {
        auto object = Lookup(h->id);
        if (!object) {
          reply({ReplyKind::kMissing, StatusCode::kOk, h->request, 0, 0}, Buffer());
          break;
        }
        uint64_t total = object->size(), chunk = options_.chunk_bytes, offset = 0;
        do {
          uint64_t n = std::min(chunk, total - offset);
          if (!reply({ReplyKind::kFound, StatusCode::kOk, h->request, total, offset},
                     object->SliceUnchecked(offset, n))) {
            break;
          }
          offset += n;
        } while (offset < total);
        break;
      }
      case Op::kExists:
        reply({Contains(h->id) ? ReplyKind::kFound : ReplyKind::kMissing, StatusCode::kOk,
               h->request, 0, 0},
              Buffer());
        break;
      case Op::kEvict:
        Erase(h->id);
        reply({ReplyKind::kFound, StatusCode::kOk, h->request, 0, 0}, Buffer());
        break;
      case Op::kSet: {
        auto slot = std::make_pair(to, h->request);
        auto it = incoming.find(slot);
        if (it == incoming.end()) {
          if (h->offset != 0) break;  // a chunk of a Set already answered: drop it
          Incoming in;
          in.id = h->id;
          in.total = h->total;
          in.error = Reserve(h->total);
          if (in.error.ok()) {
            in.reserved = true;
            auto b = Buffer::Allocate(h->total);
            if (b.ok()) {
              in.bytes = std::move(b).value();
            } else {
              in.error = b.status();
            }
          }
          it = incoming.emplace(slot, std::move(in)).first;
        }
        Incoming& in = it->second;
        in.last_chunk = std::chrono::steady_clock::now();
        uint64_t n = data.size();
        if (in.error.ok() && (h->id != in.id || h->total != in.total || h->offset != in.received ||
                              n > in.total - in.received)) {
          in.error = Corrupt("zmq server " + address_ + ": chunk at " + std::to_string(h->offset) +
                             " of " + in.id + " does not follow the " +
                             std::to_string(in.received) + " bytes received");
        }
        if (!in.error.ok()) {
          // Answered now; chunks still on their way find no entry and are dropped.
          if (in.reserved) Unreserve(in.total);
          Status s = in.error;
          incoming.erase(it);
          reply_status(h->request, s);
          break;
        }
        if (n > 0) std::memcpy(in.bytes.mutable_data() + in.received, data.view().data(), n);
        in.received += n;
        if (in.received < in.total) {
          // Acknowledges the chunk: the client keeps a window of chunks in flight.
          reply({ReplyKind::kFound, StatusCode::kOk, h->request, in.total, in.received}, Buffer());
          break;
        }
        {
          std::lock_guard<std::mutex> lock(mu_);
          reserved_ -= in.total;
          auto old = objects_.find(in.id);
          if (old != objects_.end()) stored_ -= old->second.size();
          stored_ += in.total;
          objects_[in.id] = std::move(in.bytes);
        }
        incoming.erase(it);
        reply({ReplyKind::kFound, StatusCode::kOk, h->request, h->total, h->total}, Buffer());
        break;
      }
    }
  }
  zmq_close(socket_);
  socket_ = nullptr;
}

}  // namespace xsilo::zmq_store
