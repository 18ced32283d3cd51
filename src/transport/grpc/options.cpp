#include "transport/grpc/options.h"

namespace xsilo::grpclink {

namespace {
Result<int64_t> Ranged(const TransportOptions& o, const std::string& key, int64_t fallback,
                       int64_t lo, int64_t hi) {
  XSILO_ASSIGN_OR_RETURN(int64_t v, BackendInt(o, key, fallback));
  if (v < lo || v > hi) {
    return InvalidArgument("grpc option " + key + "=" + std::to_string(v) + " outside [" +
                           std::to_string(lo) + ", " + std::to_string(hi) + "]");
  }
  return v;
}
}  // namespace

Result<GrpcOptions> ParseGrpcOptions(const TransportOptions& o) {
  XSILO_RETURN_IF_ERROR(
      CheckBackendKeys(o, {"mode", "chunk_bytes", "window_bytes", "streams", "tls_ca", "tls_cert",
                           "tls_key", "tls_server_name", "token", "keepalive_ms",
                           "initial_backoff_ms", "max_backoff_ms", "drain_ms", "recycle_bytes"}));
  GrpcOptions g;
  g.mode = BackendString(o, "mode", g.mode);
  if (g.mode != "stream" && g.mode != "unary")
    return InvalidArgument("grpc option mode='" + g.mode + "' (expected stream or unary)");
  XSILO_ASSIGN_OR_RETURN(int64_t chunk, Ranged(o, "chunk_bytes", 1 << 20, 1 << 10, 64 << 20));
  XSILO_ASSIGN_OR_RETURN(int64_t window,
                         Ranged(o, "window_bytes", int64_t{32} << 20, 1, int64_t{1} << 40));
  XSILO_ASSIGN_OR_RETURN(int64_t recycle,
                         Ranged(o, "recycle_bytes", int64_t{2} << 30, 0, int64_t{1} << 40));
  XSILO_ASSIGN_OR_RETURN(int64_t streams, Ranged(o, "streams", 1, 1, 64));
  XSILO_ASSIGN_OR_RETURN(g.keepalive_ms, Ranged(o, "keepalive_ms", 20000, 10, 3600000));
  XSILO_ASSIGN_OR_RETURN(g.initial_backoff_ms, Ranged(o, "initial_backoff_ms", 100, 1, 600000));
  XSILO_ASSIGN_OR_RETURN(g.max_backoff_ms, Ranged(o, "max_backoff_ms", 5000, 1, 3600000));
  XSILO_ASSIGN_OR_RETURN(g.drain_ms, Ranged(o, "drain_ms", 5000, 0, 600000));
  g.chunk_bytes = static_cast<uint64_t>(chunk);
  g.window_bytes = static_cast<uint64_t>(window);
  g.recycle_bytes = static_cast<uint64_t>(recycle);
  g.streams = static_cast<int>(streams);
  g.tls_ca = BackendString(o, "tls_ca", "");
  g.tls_cert = BackendString(o, "tls_cert", "");
  g.tls_key = BackendString(o, "tls_key", "");
  g.tls_server_name = BackendString(o, "tls_server_name", "");
  g.token = BackendString(o, "token", "");
  if (g.tls_cert.empty() != g.tls_key.empty())
    return InvalidArgument("grpc options tls_cert and tls_key go together");
  if (o.rank == 0 && g.tls() && g.tls_cert.empty())
    return InvalidArgument("grpc server TLS needs tls_cert and tls_key");
  if (o.rank != 0 && g.tls() && g.tls_ca.empty())
    return InvalidArgument("grpc client TLS needs tls_ca to verify the server");
  if (o.address.empty()) return InvalidArgument("grpc transport needs options.address host:port");
  return g;
}

}  // namespace xsilo::grpclink
