// Private: TLS for endpoint and relay links, over OpenSSL on a connected
// socket. Peers pin each other by certificate fingerprint (hex SHA-256 of
// the DER certificate) instead of trusting a CA: every endpoint has its own
// self-signed certificate, and the relay tells a peer which fingerprint to
// expect. The relay itself is verified against a CA file (its certificate,
// when self-signed).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "xsilo/core/status.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace xsilo::endpoint {

// A certificate and key, and the contexts that use them.
class TlsIdentity {
 public:
  // Loads cert_file/key_file; relay_ca "" uses the system's CA paths.
  static Result<std::shared_ptr<TlsIdentity>> Load(const std::string& cert_file,
                                                   const std::string& key_file,
                                                   const std::string& relay_ca = "");
  // dir/cert.pem + dir/key.pem, generated (self-signed for `hosts`) when absent.
  static Result<std::shared_ptr<TlsIdentity>> LoadOrCreate(const std::string& dir,
                                                           const std::vector<std::string>& hosts,
                                                           const std::string& relay_ca = "");
  ~TlsIdentity();
  TlsIdentity(const TlsIdentity&) = delete;
  TlsIdentity& operator=(const TlsIdentity&) = delete;

  const std::string& fingerprint() const { return fingerprint_; }
  const std::string& cert_file() const { return cert_file_; }
  // Server side: asks the client for its certificate (any, checked by
  // fingerprint afterwards).
  SSL_CTX* server_ctx() const { return server_; }
  // Client side presenting this certificate: `pinned` checks nothing during
  // the handshake (the caller compares fingerprints), `relay` verifies the
  // server against the relay CA and the host name.
  SSL_CTX* pinned_client_ctx() const { return pinned_; }
  SSL_CTX* relay_client_ctx() const { return relay_; }

 private:
  TlsIdentity() = default;
  std::string cert_file_, fingerprint_;
  SSL_CTX* server_ = nullptr;
  SSL_CTX* pinned_ = nullptr;
  SSL_CTX* relay_ = nullptr;
};

// One TLS session over a socket it owns.
class TlsStream {
 public:
  // The handshakes; the socket's io timeout bounds each. On failure the
  // socket is closed.
  static Result<std::unique_ptr<TlsStream>> Accept(SSL_CTX* ctx, int fd);
  // verify_host "" skips the host name check (pinned peers).
  static Result<std::unique_ptr<TlsStream>> Connect(SSL_CTX* ctx, int fd,
                                                    const std::string& verify_host);
  ~TlsStream();

  // The peer's certificate fingerprint, "" when it sent none.
  const std::string& peer_fingerprint() const { return peer_fp_; }
  int fd() const { return fd_; }

  Status Write(const void* data, size_t n);
  Status WriteLine(const std::string& line) { return Write((line + "\n").data(), line.size() + 1); }
  // A line without its "\n"; InvalidArgument past max bytes.
  Result<std::string> ReadLine(size_t max = 4096);
  Status ReadExact(void* data, size_t n);
  // Unblocks a reader or writer in another thread (shutdown(2) of the socket).
  void Interrupt();

 private:
  TlsStream(SSL* ssl, int fd);
  SSL* ssl_;
  int fd_;
  std::string peer_fp_;
  std::string rbuf_;
  size_t rpos_ = 0;
};

// Hex SHA-256 of the PEM certificate in `file`.
Result<std::string> CertificateFingerprint(const std::string& file);

}  // namespace xsilo::endpoint
