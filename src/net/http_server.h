// Net layer: a small HTTP/1.1 server on blocking sockets, made for large
// bodies; it serves the embedded S3 server, the object endpoint and the
// metrics endpoint.
//
// One acceptor thread hands connections to a bounded pool of worker threads
// (grown lazily up to max_connections); a worker serves one keep-alive
// connection at a time. Request bodies are read by the handler, straight
// into a preallocated Buffer sized by Content-Length; response bodies are a
// gather list of Buffers written with sendmsg, so a stored object (heap or
// file mapping) goes to the socket with no intermediate copy.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "xsilo/core/buffer.h"
#include "xsilo/core/status.h"

typedef struct ssl_st SSL;

namespace xsilo::net {

// Header (or query) name-value pairs in arrival order. s3/sigv4.h names the
// same type s3::Params.
using Params = std::vector<std::pair<std::string, std::string>>;

class TlsServerContext;

// One connection: its socket, and its TLS session when the server has TLS.
struct Link {
  int fd = -1;
  SSL* ssl = nullptr;
};

struct HttpRequest {
  std::string method;
  std::string target;     // raw request-target, e.g. "/b/k?uploads"
  std::string raw_path;   // target before '?', still percent-encoded
  std::string raw_query;  // target after '?'
  Params headers;         // names lowercased, values trimmed, in arrival order
  bool has_content_length = false;
  uint64_t content_length = 0;
  bool chunked = false;  // Transfer-Encoding: chunked (then no Content-Length)
  bool keep_alive = true;

  // First value of a header (lowercase name), or nullptr.
  const std::string* Header(std::string_view lower_name) const;
};

// Reads the request body for the handler. A handler that does not read the
// whole body makes the server close the connection after the response.
class BodyReader {
 public:
  // Sees each piece of the body as it lands in the Buffer ReadAll returns,
  // in order, so that a handler hashes bytes while the rest is in flight.
  using Observer = std::function<void(const uint8_t* data, size_t n)>;
  virtual ~BodyReader() = default;
  // True while body bytes remain unread.
  virtual bool pending() const = 0;
  // Reads the whole body into one Buffer: a Content-Length body straight
  // into a Buffer of that size; a chunked one decoded (pieces gathered, then
  // joined). A body of more than `limit` bytes fails with
  // ResourceExhausted before it is read past the limit; a connection lost
  // or broken framing with Unavailable / InvalidArgument.
  virtual Result<Buffer> ReadAll(uint64_t limit, const Observer& observe) = 0;
};

struct HttpResponse {
  int status = 200;
  Params headers;            // Content-Length and Connection are added by the server
  std::vector<Buffer> body;  // gather list, written without copying
  // Sent after `body` with sendfile(2): file_length bytes of file_fd from
  // file_offset. file_owner keeps the descriptor open until then.
  int file_fd = -1;
  uint64_t file_offset = 0;
  uint64_t file_length = 0;
  std::shared_ptr<const void> file_owner;
  uint64_t content_length = 0;  // set from body unless omit_body
  // HEAD: announce content_length but send no body.
  bool omit_body = false;
  bool close = false;  // close the connection after this response

  // Each replaces the whole body, a file body included.
  void SetBody(std::string text);
  void SetBody(std::vector<Buffer> segments);
  void ClearFile();
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // address to bind
  int port = 0;                    // 0: pick an ephemeral port
  uint64_t max_header_bytes = 64 << 10;
  int max_connections = 64;           // worker threads; further connections wait in a queue
  int max_queued_connections = 1024;  // beyond this, new connections get 503
  std::chrono::milliseconds idle_timeout{60000};  // keep-alive idle limit
  std::chrono::milliseconds io_timeout{60000};    // one blocked send/recv
  // TLS on every connection (https); null: plain HTTP.
  std::shared_ptr<TlsServerContext> tls;
  // Test hook: if set and it returns n >= 0 for a request, the connection
  // is closed after n bytes of that response's body were sent.
  std::function<int64_t(const HttpRequest&)> drop_after_body_bytes;
  // Body of errors the server answers itself (malformed request, header too
  // large): returns {content type, body}. Default: plain text.
  std::function<std::pair<std::string, std::string>(int status, std::string_view message)>
      format_error;
};

using HttpHandler = std::function<void(const HttpRequest&, BodyReader&, HttpResponse*)>;

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  Status Start();
  // Closes the listener and every open connection, then joins all threads.
  void Stop();
  int port() const { return port_; }
  // Connections answered 503 because the process had no descriptor left.
  uint64_t refused_no_descriptor() const { return refused_no_descriptor_.load(); }

 private:
  void AcceptLoop();
  void RefuseWithSpareDescriptor();  // on EMFILE/ENFILE; the acceptor only
  void WorkerLoop();
  // True when the connection is idle and kept alive: the caller parks it.
  bool ServeConnection(const Link& link);
  void CloseLocked(int fd);  // closes fd and frees its TLS session; caller holds mu_
  void Dispatch(int fd);     // caller holds mu_

  HttpServerOptions options_;
  HttpHandler handler_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd that wakes the acceptor on Stop
  // Held open for the moment the process runs out of descriptors: closed to
  // accept one pending connection and answer it 503 (the acceptor's only).
  int spare_fd_ = -1;
  std::atomic<uint64_t> refused_no_descriptor_{0};
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::thread acceptor_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<int> queue_;
  std::vector<std::thread> workers_;
  int idle_workers_ = 0;
  std::set<int> active_fds_;
  std::unordered_map<int, SSL*> tls_sessions_;  // by socket, while the connection is open
  // Open connections between requests, watched by the acceptor (not by a
  // worker), so idle keep-alive connections hold no thread. Only the
  // acceptor removes entries; workers append.
  std::vector<std::pair<int, std::chrono::steady_clock::time_point>> parked_;
};

}  // namespace xsilo::net
