#include "endpoint/ticket.h"

#include <openssl/rand.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "net/crypto.h"
#include "xsilo/core/log.h"
#include "xsilo/core/secret.h"

namespace xsilo::endpoint {

namespace {

std::string Mac(const std::string& secret, const std::string& fields) {
  auto d = net::HmacSha256(
      std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(secret.data()), secret.size()),
      "xsilo-endpoint-ticket-v1|" + fields);
  return net::Hex(d);
}

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    out.push_back(s.substr(start, p - start));
    if (p == std::string::npos) return out;
    start = p + 1;
  }
}

}  // namespace

int64_t UnixMillis() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string RandomSecret() {
  uint8_t b[32];
  if (RAND_bytes(b, sizeof b) != 1) {
    // Never hand out a secret or token that is not random.
    static constinit LogComponent log("endpoint");
    XSILO_LOG(log, kError, "the OpenSSL random generator failed");
    std::abort();
  }
  return net::Hex(std::span<const uint8_t>(b, sizeof b));
}

std::string MakeTicket(const std::string& secret, const std::string& from,
                       const std::string& from_fp, const std::string& to, int64_t expiry_ms) {
  std::string fields = from + "." + from_fp + "." + to + "." + std::to_string(expiry_ms);
  return "v1." + fields + "." + Mac(secret, fields);
}

Status VerifyTicket(const std::string& ticket, const std::string& secret,
                    const std::string& own_uuid, const std::string& client_fp, int64_t now_ms,
                    std::string* from) {
  if (ticket.empty() || ticket == "-") return PermissionDenied("no ticket from the relay");
  auto f = Split(ticket, '.');
  if (f.size() != 6 || f[0] != "v1") return PermissionDenied("malformed ticket");
  std::string fields = f[1] + "." + f[2] + "." + f[3] + "." + f[4];
  std::string want = Mac(secret, fields);
  if (secret.empty() || !SecretEquals(f[5], want)) {
    return PermissionDenied("ticket not signed by the relay this endpoint registered with");
  }
  if (f[3] != own_uuid) return PermissionDenied("ticket is for endpoint " + f[3]);
  int64_t expiry = 0;
  try {
    expiry = std::stoll(f[4]);
  } catch (...) {
    return PermissionDenied("malformed ticket expiry");
  }
  if (expiry < now_ms) return PermissionDenied("ticket expired");
  if (client_fp.empty() || f[2] != client_fp) {
    return PermissionDenied("ticket was issued to another certificate than the client's");
  }
  if (from) *from = f[1];
  return Status::OK();
}

}  // namespace xsilo::endpoint
