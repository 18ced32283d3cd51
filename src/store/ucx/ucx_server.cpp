// The server side of the ucx connector: each accepted endpoint reads a
// request header, answers it from the object table, and reads the next one.
#include "store/ucx/ucx_internal.h"

namespace xsilo::ucx {

void Worker::OnConnRequest(ucp_conn_request_h request, void* arg) {
  auto* self = static_cast<Worker*>(arg);
  std::shared_ptr<Conn> conn = self->NewConn("a client of this server");
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.conn_request = request;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Worker::OnEpError;
  params.err_handler.arg = conn.get();
  if (ucp_ep_create(self->worker_, &params, &conn->ep) != UCS_OK) {
    conn->ep = nullptr;
    self->conns_.erase(conn);
    return;
  }
  self->ServeNext(conn);
}

void Worker::ServeNext(const std::shared_ptr<Conn>& conn) {
  Recv(conn, conn->request.data(), conn->request.size(), [this, conn](ucs_status_t st) {
    if (st != UCS_OK) return CloseConn(conn, "client went away");
    std::optional<Request> request = DecodeRequest(conn->request);
    // A peer that does not speak this protocol: nothing to answer.
    if (!request) return CloseConn(conn, "malformed request");
    Serve(conn, *request);
  });
}

void Worker::Serve(const std::shared_ptr<Conn>& conn, const Request& request) {
  switch (request.op) {
    case Op::kGet: {
      std::optional<GatherList> object = table_->Find(request.id);
      if (!object) return Answer(conn, {ReplyStatus::kNotFound, 0}, {});
      uint64_t size = object->size;
      return Answer(conn, {ReplyStatus::kOk, size}, std::move(*object));
    }
    case Op::kExists:
      return Answer(conn, {ReplyStatus::kOk, table_->Contains(request.id) ? 1u : 0u}, {});
    case Op::kEvict:
      table_->Erase(request.id);
      return Answer(conn, {ReplyStatus::kOk, 0}, {});
    case Op::kSet:
      break;
  }
  const uint64_t size = request.size;
  const std::string id = request.id;
  Result<Buffer> buffer = Buffer();
  bool fits = table_->Reserve(size);
  if (fits && size > 0) {
    buffer = Buffer::Allocate(size);
    if (!buffer.ok()) {
      table_->Unreserve(size);
      fits = false;
    }
  }
  if (!fits) {
    // The body follows the header on the stream: drain it, then refuse.
    return DiscardBody(conn, size, [this, conn](ucs_status_t st) {
      if (st != UCS_OK) return CloseConn(conn, "client went away");
      Answer(conn, {ReplyStatus::kResourceExhausted, 0}, {});
    });
  }
  Buffer dest = *buffer;
  RecvBody(conn, dest.mutable_data(), size, nullptr, [this, conn, dest, id, size](ucs_status_t st) {
    if (st != UCS_OK) {
      table_->Unreserve(size);
      return CloseConn(conn, "client went away");
    }
    GatherList object;
    if (size > 0) object.Append(dest);
    table_->Insert(id, std::move(object));
    Answer(conn, {ReplyStatus::kOk, 0}, {});
  });
}

void Worker::Answer(const std::shared_ptr<Conn>& conn, Reply reply, GatherList body) {
  auto header = std::make_shared<ReplyBytes>(EncodeReply(reply));
  Send(conn, header->data(), header->size(), [this, conn, header](ucs_status_t st) {
    if (st != UCS_OK) CloseConn(conn, "client went away");
  });
  if (body.size > 0) {
    SendBody(conn, body, nullptr, [this, conn](ucs_status_t st) {
      if (st != UCS_OK) CloseConn(conn, "client went away");
    });
  }
  // The stream keeps order: the next request can be read while this reply
  // is still being sent.
  ServeNext(conn);
}

void Worker::DiscardBody(const std::shared_ptr<Conn>& conn, uint64_t remaining, Done done) {
  if (remaining == 0) return done(UCS_OK);
  uint64_t n = std::min<uint64_t>(remaining, scratch_.size());
  Recv(conn, scratch_.data(), n, [this, conn, remaining, n, done](ucs_status_t st) {
    if (st != UCS_OK) return done(st);
    DiscardBody(conn, remaining - n, done);
  });
}

}  // namespace xsilo::ucx
