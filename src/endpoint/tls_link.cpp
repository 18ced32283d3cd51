#include "endpoint/tls_link.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "net/crypto.h"
#include "net/sigpipe.h"
#include "net/tls.h"

namespace xsilo::endpoint {

namespace {

std::string SslError() {
  unsigned long e = ERR_get_error();
  if (e == 0) return errno ? std::strerror(errno) : "unknown error";
  char buf[256];
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

std::string FingerprintOf(X509* cert) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  X509_digest(cert, EVP_sha256(), md, &n);
  return net::Hex(std::span<const uint8_t>(md, n));
}

int AcceptAnyCertificate(int, X509_STORE_CTX*) { return 1; }

Status UseIdentity(SSL_CTX* ctx, const std::string& cert, const std::string& key) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert.c_str()) != 1 ||
      SSL_CTX_use_PrivateKey_file(ctx, key.c_str(), SSL_FILETYPE_PEM) != 1 ||
      SSL_CTX_check_private_key(ctx) != 1) {
    return InvalidArgument("TLS identity " + cert + " / " + key + ": " + SslError());
  }
  return Status::OK();
}

using net::SigpipeBlock;  // OpenSSL writes without MSG_NOSIGNAL

}  // namespace

Result<std::string> CertificateFingerprint(const std::string& file) {
  FILE* f = std::fopen(file.c_str(), "r");
  if (!f) return NotFound("open " + file + ": " + std::strerror(errno));
  X509* cert = PEM_read_X509(f, nullptr, nullptr, nullptr);
  std::fclose(f);
  if (!cert) return InvalidArgument("no PEM certificate in " + file);
  std::string fp = FingerprintOf(cert);
  X509_free(cert);
  return fp;
}

Result<std::shared_ptr<TlsIdentity>> TlsIdentity::Load(const std::string& cert_file,
                                                       const std::string& key_file,
                                                       const std::string& relay_ca) {
  std::shared_ptr<TlsIdentity> id(new TlsIdentity());
  id->cert_file_ = cert_file;
  XSILO_ASSIGN_OR_RETURN(id->fingerprint_, CertificateFingerprint(cert_file));
  id->server_ = SSL_CTX_new(TLS_server_method());
  id->pinned_ = SSL_CTX_new(TLS_client_method());
  id->relay_ = SSL_CTX_new(TLS_client_method());
  if (!id->server_ || !id->pinned_ || !id->relay_) return Internal("SSL_CTX_new: " + SslError());
  for (SSL_CTX* ctx : {id->server_, id->pinned_, id->relay_}) {
    XSILO_RETURN_IF_ERROR(UseIdentity(ctx, cert_file, key_file));
  }
  SSL_CTX_set_verify(id->server_, SSL_VERIFY_PEER, AcceptAnyCertificate);
  SSL_CTX_set_verify(id->pinned_, SSL_VERIFY_NONE, nullptr);
  SSL_CTX_set_verify(id->relay_, SSL_VERIFY_PEER, nullptr);
  if (relay_ca.empty()) {
    SSL_CTX_set_default_verify_paths(id->relay_);
  } else if (SSL_CTX_load_verify_locations(id->relay_, relay_ca.c_str(), nullptr) != 1) {
    return InvalidArgument("relay CA " + relay_ca + ": " + SslError());
  }
  return id;
}

Result<std::shared_ptr<TlsIdentity>> TlsIdentity::LoadOrCreate(
    const std::string& dir, const std::vector<std::string>& hosts, const std::string& relay_ca) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Internal("create " + dir + ": " + ec.message());
  const std::string cert = dir + "/cert.pem", key = dir + "/key.pem";
  if (!std::filesystem::exists(cert) || !std::filesystem::exists(key)) {
    XSILO_RETURN_IF_ERROR(net::GenerateSelfSignedCertificate(cert, key, hosts, 3650));
  }
  return Load(cert, key, relay_ca);
}

TlsIdentity::~TlsIdentity() {
  SSL_CTX_free(server_);
  SSL_CTX_free(pinned_);
  SSL_CTX_free(relay_);
}

TlsStream::TlsStream(SSL* ssl, int fd) : ssl_(ssl), fd_(fd) {
  X509* cert = SSL_get1_peer_certificate(ssl_);
  if (cert) {
    peer_fp_ = FingerprintOf(cert);
    X509_free(cert);
  }
}

TlsStream::~TlsStream() {
  SSL_free(ssl_);
  ::close(fd_);
}

Result<std::unique_ptr<TlsStream>> TlsStream::Accept(SSL_CTX* ctx, int fd) {
  SSL* ssl = SSL_new(ctx);
  if (!ssl) {
    ::close(fd);
    return Internal("SSL_new: " + SslError());
  }
  SSL_set_fd(ssl, fd);
  SigpipeBlock guard;
  if (SSL_accept(ssl) != 1) {
    std::string why = SslError();
    SSL_free(ssl);
    ::close(fd);
    return Unavailable("TLS accept: " + why);
  }
  return std::unique_ptr<TlsStream>(new TlsStream(ssl, fd));
}

Result<std::unique_ptr<TlsStream>> TlsStream::Connect(SSL_CTX* ctx, int fd,
                                                      const std::string& verify_host) {
  SSL* ssl = SSL_new(ctx);
  if (!ssl) {
    ::close(fd);
    return Internal("SSL_new: " + SslError());
  }
  SSL_set_fd(ssl, fd);
  if (!verify_host.empty()) {
    in6_addr a6;
    in_addr a4;
    bool ip = inet_pton(AF_INET, verify_host.c_str(), &a4) == 1 ||
              inet_pton(AF_INET6, verify_host.c_str(), &a6) == 1;
    if (ip) {
      X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(ssl), verify_host.c_str());
    } else {
      SSL_set1_host(ssl, verify_host.c_str());
      SSL_set_tlsext_host_name(ssl, verify_host.c_str());
    }
  }
  SigpipeBlock guard;
  if (SSL_connect(ssl) != 1) {
    std::string why = SslError();
    long v = SSL_get_verify_result(ssl);
    if (v != X509_V_OK) why += std::string(" (") + X509_verify_cert_error_string(v) + ")";
    SSL_free(ssl);
    ::close(fd);
    return Unavailable("TLS handshake: " + why);
  }
  return std::unique_ptr<TlsStream>(new TlsStream(ssl, fd));
}

Status TlsStream::Write(const void* data, size_t n) {
  SigpipeBlock guard;
  while (n > 0) {
    int w = SSL_write(ssl_, data, static_cast<int>(std::min<size_t>(n, 1 << 30)));
    if (w <= 0) return Unavailable("TLS write: " + SslError());
    data = static_cast<const char*>(data) + w;
    n -= static_cast<size_t>(w);
  }
  return Status::OK();
}

Result<std::string> TlsStream::ReadLine(size_t max) {
  while (true) {
    size_t nl = rbuf_.find('\n', rpos_);
    if (nl != std::string::npos) {
      std::string line = rbuf_.substr(rpos_, nl - rpos_);
      rpos_ = nl + 1;
      return line;
    }
    if (rbuf_.size() - rpos_ > max)
      return InvalidArgument("line longer than " + std::to_string(max));
    rbuf_.erase(0, rpos_);
    rpos_ = 0;
    char chunk[4096];
    SigpipeBlock guard;  // a read may write (TLS 1.3 key updates, alerts)
    int r = SSL_read(ssl_, chunk, sizeof chunk);
    if (r <= 0) return Unavailable("TLS read: connection closed or timed out");
    rbuf_.append(chunk, static_cast<size_t>(r));
  }
}

Status TlsStream::ReadExact(void* data, size_t n) {
  char* out = static_cast<char*>(data);
  size_t have = std::min(n, rbuf_.size() - rpos_);
  std::memcpy(out, rbuf_.data() + rpos_, have);
  rpos_ += have;
  SigpipeBlock guard;
  while (have < n) {
    int r = SSL_read(ssl_, out + have, static_cast<int>(std::min<size_t>(n - have, 1 << 30)));
    if (r <= 0) {
      return Unavailable("TLS read broke after " + std::to_string(have) + " of " +
                         std::to_string(n) + " bytes");
    }
    have += static_cast<size_t>(r);
  }
  return Status::OK();
}

void TlsStream::Interrupt() { ::shutdown(fd_, SHUT_RDWR); }

}  // namespace xsilo::endpoint
