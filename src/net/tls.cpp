#include "net/tls.h"

#include <arpa/inet.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <cstdio>
#include <random>

namespace xsilo::net {

namespace {

std::string OpenSslError() {
  std::string out;
  while (unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof(buf));
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "unknown OpenSSL error" : out;
}

bool IsIpLiteral(const std::string& h) {
  unsigned char buf[16];
  return ::inet_pton(AF_INET, h.c_str(), buf) == 1 || ::inet_pton(AF_INET6, h.c_str(), buf) == 1;
}

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

}  // namespace xsilo::net
