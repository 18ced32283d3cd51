// Net layer: TLS for the HttpServer (the embedded S3 server, the endpoint),
// over OpenSSL.
//
// The server side only: a context loaded from a PEM certificate chain and
// key, TLS 1.2 or newer. Clients are libcurl's (S3ClientOptions::ca_file,
// UrlTlsOptions). GenerateSelfSignedCertificate writes a pair for local jobs
// (`xsilo s3d --tls-self-signed`, the hybrid's embedded server with
// store.tls=1): the certificate is its own CA, so the file a client is told
// to trust is the certificate itself.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "xsilo/core/status.h"

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

}  // namespace xsilo::net
