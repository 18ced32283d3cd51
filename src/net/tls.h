// Net layer: TLS over OpenSSL, TLS 1.2 or newer, in one place for every
// layer that speaks it.
//
// Servers of the HttpServer (the embedded S3 server, the object endpoint):
// TlsServerContext, a context loaded from a PEM certificate chain and key.
// Their clients are libcurl's (S3ClientOptions::ca_file, UrlTlsOptions).
//
// Endpoint and relay links (src/endpoint): TlsIdentity and TlsStream, one
// session over a connected socket. Peers pin each other by certificate
// fingerprint (hex SHA-256 of the DER certificate) instead of trusting a
// CA: every endpoint has its own self-signed certificate, and the relay
// tells a peer which fingerprint to expect. The relay itself is verified
// against a CA file (its certificate, when self-signed).
//
// GenerateSelfSignedCertificate writes a pair for local jobs (`xsilo s3d
// --tls-self-signed`, the hybrid's embedded server with store.tls=1, an
// endpoint's identity): the certificate is its own CA, so the file a
// client is told to trust is the certificate itself.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xsilo/core/status.h"

typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;

namespace xsilo::net {

class TlsServerContext {
 public:
  // InvalidArgument naming the file and OpenSSL's reason when the pair does
  // not load or the key does not match the certificate.
  static Result<std::shared_ptr<TlsServerContext>> Load(const std::string& cert_file,
                                                        const std::string& key_file);
  ~TlsServerContext();
  TlsServerContext(const TlsServerContext&) = delete;
  TlsServerContext& operator=(const TlsServerContext&) = delete;
  SSL_CTX* ctx() const { return ctx_; }

 private:
  explicit TlsServerContext(SSL_CTX* ctx) : ctx_(ctx) {}
  SSL_CTX* ctx_;
};

// Writes a self-signed certificate (ECDSA P-256, SHA-256, valid from an
// hour ago for `days`) for `hosts` (IPv4/IPv6 literals become IP subject
// alternative names, anything else DNS names; the first is the common name)
// to cert_file, and its key to key_file (mode 0600).
Status GenerateSelfSignedCertificate(const std::string& cert_file, const std::string& key_file,
                                     const std::vector<std::string>& hosts, int days = 30);

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

}  // namespace xsilo::net
