#include "xsilo/metrics/endpoint.h"

#include <arpa/inet.h>

#include <cstdlib>
#include <mutex>

#include "net/http_server.h"

namespace xsilo::metrics {

struct MetricsEndpoint::Impl {
  const Registry& registry;
  EndpointOptions options;
  std::unique_ptr<net::HttpServer> http;
  std::once_flag stopped;

  Impl(const Registry& r, EndpointOptions o) : registry(r), options(std::move(o)) {}

  void Handle(const net::HttpRequest& req, net::HttpResponse* resp) const {
    const bool head = req.method == "HEAD";
    std::string type = "text/plain; charset=utf-8";
    std::string body;
    if (req.method != "GET" && !head) {
      resp->status = 405;
      resp->headers.emplace_back("Allow", "GET, HEAD");
      body = "only GET /metrics\n";
    } else if (req.raw_path != "/metrics") {
      resp->status = 404;
      body = "metrics are at /metrics\n";
    } else {
      type = "text/plain; version=0.0.4; charset=utf-8";
      body = registry.Render();
    }
    resp->headers.emplace_back("Content-Type", std::move(type));
    if (head) {
      resp->content_length = body.size();
      resp->omit_body = true;
    } else {
      resp->SetBody(std::move(body));
    }
  }
};

Result<std::optional<int>> ParseMetricsPort(const std::string& text) {
  if (text.empty() || text == "0") return std::optional<int>();
  if (text == "auto") return std::optional<int>(0);
  char* end = nullptr;
  const long v = std::strtol(text.c_str(), &end, 10);
  if (end == text.c_str() || *end != '\0' || v < 1 || v > 65535) {
    return InvalidArgument("a metrics port is 1..65535, 0 (off) or 'auto', not '" + text + "'");
  }
  return std::optional<int>(static_cast<int>(v));
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(const Registry& registry,
                                                                EndpointOptions options) {
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("metrics port " + std::to_string(options.port) + " is out of range");
  }
  in_addr probe{};
  if (::inet_pton(AF_INET, options.address.c_str(), &probe) != 1) {
    return InvalidArgument("metrics address '" + options.address + "' is not an IPv4 literal");
  }
  auto impl = std::make_unique<Impl>(registry, std::move(options));
  net::HttpServerOptions ho;
  ho.host = impl->options.address;
  ho.port = impl->options.port;
  ho.max_header_bytes = 8192;
  // A scrape is small and rare: two workers, and few connections queued.
  ho.max_connections = 2;
  ho.max_queued_connections = 16;
  ho.idle_timeout = impl->options.io_timeout;
  ho.io_timeout = impl->options.io_timeout;
  const Impl* raw = impl.get();
  impl->http = std::make_unique<net::HttpServer>(
      std::move(ho), [raw](const net::HttpRequest& req, net::BodyReader&, net::HttpResponse* resp) {
        raw->Handle(req, resp);
      });
  if (Status st = impl->http->Start(); !st.ok()) {
    return Status(st.code(), "metrics endpoint: " + st.message());
  }
  return std::unique_ptr<MetricsEndpoint>(new MetricsEndpoint(std::move(impl)));
}

MetricsEndpoint::MetricsEndpoint(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

MetricsEndpoint::~MetricsEndpoint() { Stop(); }

int MetricsEndpoint::port() const { return impl_->http->port(); }

std::string MetricsEndpoint::url() const {
  return "http://" + impl_->options.address + ":" + std::to_string(port()) + "/metrics";
}

void MetricsEndpoint::Stop() {
  std::call_once(impl_->stopped, [this] { impl_->http->Stop(); });
}

}  // namespace xsilo::metrics
