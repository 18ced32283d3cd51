#include "net/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>

#include "net/crypto.h"
#include "net/sigpipe.h"

namespace xsilo::net {

namespace {

// Every error OpenSSL queued on this thread, oldest first (the queue is
// left empty); errno's text when it queued none (a socket error).
std::string OpenSslError() {
  const int saved_errno = errno;
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  if (!out.empty()) return out;
  return saved_errno != 0 ? std::strerror(saved_errno) : "unknown OpenSSL error";
}

bool IsIpLiteral(const std::string& h) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, h.c_str(), buf) == 1 || ::inet_pton(AF_INET6, h.c_str(), buf) == 1;
}

// TLS 1.2 or newer, whole writes, and the certificate chain and key of
// cert_file/key_file. InvalidArgument naming the file and OpenSSL's reason
// when the pair does not load or the key does not match the certificate.
Status UseIdentity(SSL_CTX* ctx, const std::string& cert_file, const std::string& key_file) {
  SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
  // Writes are whole: SSL_write returns only when all bytes are sent.
  SSL_CTX_set_mode(ctx, SSL_MODE_AUTO_RETRY);
  if (SSL_CTX_use_certificate_chain_file(ctx, cert_file.c_str()) != 1) {
    return InvalidArgument("TLS certificate " + cert_file + ": " + OpenSslError());
  }
  if (SSL_CTX_use_PrivateKey_file(ctx, key_file.c_str(), SSL_FILETYPE_PEM) != 1) {
    return InvalidArgument("TLS key " + key_file + " does not load or does not match certificate " +
                           cert_file + ": " + OpenSslError());
  }
  if (SSL_CTX_check_private_key(ctx) != 1) {
    return InvalidArgument("TLS key " + key_file + " does not match certificate " + cert_file);
  }
  return Status::OK();
}

std::string FingerprintOf(X509* cert) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  X509_digest(cert, EVP_sha256(), md, &n);
  return Hex(std::span<const uint8_t>(md, n));
}

int AcceptAnyCertificate(int, X509_STORE_CTX*) { return 1; }

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using X509Ptr = std::unique_ptr<X509, Deleter<X509, X509_free>>;

}  // namespace

Result<std::shared_ptr<TlsServerContext>> TlsServerContext::Load(const std::string& cert_file,
                                                                 const std::string& key_file) {
  ERR_clear_error();
  SSL_CTX* ctx = SSL_CTX_new(TLS_server_method());
  if (ctx == nullptr) return Internal("SSL_CTX_new: " + OpenSslError());
  std::shared_ptr<TlsServerContext> out(new TlsServerContext(ctx));
  XSILO_RETURN_IF_ERROR(UseIdentity(ctx, cert_file, key_file));
  return out;
}

TlsServerContext::~TlsServerContext() { SSL_CTX_free(ctx_); }

Status GenerateSelfSignedCertificate(const std::string& cert_file, const std::string& key_file,
                                     const std::vector<std::string>& hosts, int days) {
  if (hosts.empty()) return InvalidArgument("a self-signed certificate needs at least one host");
  if (days < 1) return InvalidArgument("a certificate must be valid for at least a day");
  ERR_clear_error();
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) return Internal("EC key generation: " + OpenSslError());
  X509Ptr cert(X509_new());
  if (!cert) return Internal("X509_new: " + OpenSslError());
  X509_set_version(cert.get(), 2);  // v3, for the extensions
  std::random_device rd;
  ASN1_INTEGER_set_uint64(X509_get_serialNumber(cert.get()),
                          (static_cast<uint64_t>(rd()) << 31) ^ rd());
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), static_cast<long>(days) * 86400);
  X509_set_pubkey(cert.get(), key.get());
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "O", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>("xsilo"), -1, -1, 0);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(hosts.front().c_str()), -1, -1,
                             0);
  X509_set_issuer_name(cert.get(), name);
  std::string san;
  for (const std::string& h : hosts) {
    if (!san.empty()) san += ",";
    san += (IsIpLiteral(h) ? "IP:" : "DNS:") + h;
  }
  X509V3_CTX v3;
  X509V3_set_ctx_nodb(&v3);
  X509V3_set_ctx(&v3, cert.get(), cert.get(), nullptr, nullptr, 0);
  const std::pair<int, std::string> extensions[] = {
      {NID_subject_alt_name, san},
      {NID_basic_constraints, "critical,CA:TRUE"},
      {NID_key_usage, "critical,digitalSignature,keyCertSign"},
      {NID_ext_key_usage, "serverAuth,clientAuth"},  // both ends of mutual TLS
  };
  for (const auto& [nid, value] : extensions) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &v3, nid, value.c_str());
    if (ext == nullptr)
      return InvalidArgument("certificate extension " + value + ": " + OpenSslError());
    X509_add_ext(cert.get(), ext, -1);
    X509_EXTENSION_free(ext);
  }
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) {
    return Internal("X509_sign: " + OpenSslError());
  }
  // The key first, created 0600 before a byte of it is written.
  const mode_t old_mask = ::umask(077);
  FILE* kf = std::fopen(key_file.c_str(), "w");
  ::umask(old_mask);
  if (kf == nullptr) return InvalidArgument("cannot write " + key_file);
  const bool key_ok =
      PEM_write_PrivateKey(kf, key.get(), nullptr, nullptr, 0, nullptr, nullptr) == 1;
  if (std::fclose(kf) != 0 || !key_ok)
    return Internal("writing " + key_file + ": " + OpenSslError());
  FILE* cf = std::fopen(cert_file.c_str(), "w");
  if (cf == nullptr) return InvalidArgument("cannot write " + cert_file);
  const bool cert_ok = PEM_write_X509(cf, cert.get()) == 1;
  if (std::fclose(cf) != 0 || !cert_ok) {
    return Internal("writing " + cert_file + ": " + OpenSslError());
  }
  return Status::OK();
}

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
  if (!id->server_ || !id->pinned_ || !id->relay_)
    return Internal("SSL_CTX_new: " + OpenSslError());
  for (SSL_CTX* ctx : {id->server_, id->pinned_, id->relay_}) {
    XSILO_RETURN_IF_ERROR(UseIdentity(ctx, cert_file, key_file));
  }
  SSL_CTX_set_verify(id->server_, SSL_VERIFY_PEER, AcceptAnyCertificate);
  SSL_CTX_set_verify(id->pinned_, SSL_VERIFY_NONE, nullptr);
  SSL_CTX_set_verify(id->relay_, SSL_VERIFY_PEER, nullptr);
  if (relay_ca.empty()) {
    SSL_CTX_set_default_verify_paths(id->relay_);
  } else if (SSL_CTX_load_verify_locations(id->relay_, relay_ca.c_str(), nullptr) != 1) {
    return InvalidArgument("relay CA " + relay_ca + ": " + OpenSslError());
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
    XSILO_RETURN_IF_ERROR(GenerateSelfSignedCertificate(cert, key, hosts, 3650));
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
    return Internal("SSL_new: " + OpenSslError());
  }
  SSL_set_fd(ssl, fd);
  SigpipeBlock guard;
  if (SSL_accept(ssl) != 1) {
    std::string why = OpenSslError();
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
    return Internal("SSL_new: " + OpenSslError());
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
    std::string why = OpenSslError();
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
    if (w <= 0) return Unavailable("TLS write: " + OpenSslError());
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

}  // namespace xsilo::net
