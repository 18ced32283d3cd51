#include "transport/grpc/options.h"

#include "transport/builtin.h"

namespace xsilo {

const OptionTable& GrpcOptionTable() {
  using T = OptionType;
  static const OptionTable table(
      "grpc",
      {
          {"mode", T::kEnum, "stream", 0, 0, "stream|unary",
           "stream: chunked frames over bidi streams; unary: one call per message (a baseline, "
           "no TLS)"},
          {"chunk_bytes", T::kBytes, "1048576", 1 << 10, 64 << 20, "",
           "bytes of message per Chunk frame"},
          {"window_bytes", T::kBytes, "33554432", 1, int64_t{1} << 40, "",
           "flow control: bytes a sender may have in flight to one peer, not yet consumed"},
          {"streams", T::kInt, "1", 1, 64, "",
           "client: parallel channels (own stream and TCP connection each); large messages are "
           "striped"},
          {"tls_ca", T::kString, "", 0, 0, "",
           "PEM roots: the client verifies the server (enables TLS); the server requires and "
           "verifies client certificates"},
          {"tls_cert", T::kString, "", 0, 0, "",
           "PEM certificate chain: the server's (enables TLS) or the client's own; with tls_key"},
          {"tls_key", T::kString, "", 0, 0, "", "PEM private key file of tls_cert"},
          {"tls_server_name", T::kString, "", 0, 0, "",
           "client: the name expected in the server certificate (default: the address's host)"},
          {"token", T::kString, "", 0, 0, "",
           "shared secret every client presents; the server refuses a client without it", true},
          {"keepalive_ms", T::kMillis, "20000", 10, 3600000, "",
           "HTTP/2 keepalive ping interval (and ping timeout)"},
          {"initial_backoff_ms", T::kMillis, "100", 1, 600000, "",
           "client reconnect: the first backoff delay, doubled per failed attempt (+-20% jitter)"},
          {"max_backoff_ms", T::kMillis, "5000", 1, 3600000, "",
           "client reconnect: the cap of the backoff delay"},
          {"drain_ms", T::kMillis, "5000", 0, 600000, "",
           "longest wait in Stop for a clean end (outcomes, confirmations, Goodbye); 0 = none"},
          {"recycle_bytes", T::kBytes, "2147483648", 0, int64_t{1} << 40, "",
           "receiver: finished messages' buffers kept for reuse (5 s idle); 0 = off"},
      });
  return table;
}

namespace grpclink {

Result<GrpcOptions> ParseGrpcOptions(const TransportOptions& o) {
  const OptionTable& t = GrpcOptionTable();
  const OptionMap& b = o.backend;
  XSILO_RETURN_IF_ERROR(t.CheckKeys(b));
  GrpcOptions g;
  XSILO_ASSIGN_OR_RETURN(g.mode, t.Enum(b, "mode"));
  XSILO_ASSIGN_OR_RETURN(int64_t chunk, t.Int(b, "chunk_bytes"));
  XSILO_ASSIGN_OR_RETURN(int64_t window, t.Int(b, "window_bytes"));
  XSILO_ASSIGN_OR_RETURN(int64_t recycle, t.Int(b, "recycle_bytes"));
  XSILO_ASSIGN_OR_RETURN(int64_t streams, t.Int(b, "streams"));
  XSILO_ASSIGN_OR_RETURN(g.keepalive_ms, t.Int(b, "keepalive_ms"));
  XSILO_ASSIGN_OR_RETURN(g.initial_backoff_ms, t.Int(b, "initial_backoff_ms"));
  XSILO_ASSIGN_OR_RETURN(g.max_backoff_ms, t.Int(b, "max_backoff_ms"));
  XSILO_ASSIGN_OR_RETURN(g.drain_ms, t.Int(b, "drain_ms"));
  g.chunk_bytes = static_cast<uint64_t>(chunk);
  g.window_bytes = static_cast<uint64_t>(window);
  g.recycle_bytes = static_cast<uint64_t>(recycle);
  g.streams = static_cast<int>(streams);
  g.tls_ca = t.String(b, "tls_ca");
  g.tls_cert = t.String(b, "tls_cert");
  g.tls_key = t.String(b, "tls_key");
  g.tls_server_name = t.String(b, "tls_server_name");
  g.token = t.String(b, "token");
  if (g.tls_cert.empty() != g.tls_key.empty())
    return InvalidArgument("grpc options tls_cert and tls_key go together");
  if (o.rank == 0 && g.tls() && g.tls_cert.empty())
    return InvalidArgument("grpc server TLS needs tls_cert and tls_key");
  if (o.rank != 0 && g.tls() && g.tls_ca.empty())
    return InvalidArgument("grpc client TLS needs tls_ca to verify the server");
  if (o.address.empty()) return InvalidArgument("grpc transport needs options.address host:port");
  return g;
}

}  // namespace grpclink
}  // namespace xsilo
