// Private: the relay's vouchers. A ticket lets endpoint `from` (holding the
// TLS certificate with fingerprint from_fp) use endpoint `to` until
// expiry_ms (Unix milliseconds):
//   v1.<from>.<from_fp>.<to>.<expiry_ms>.<hex HMAC-SHA256(secret_to, fields)>
// secret_to is what the relay handed `to` when it registered; only the
// relay and `to` know it, so `to` accepts exactly the peers the relay vouched
// for, and only over a TLS session whose client certificate is from_fp.
#pragma once

#include <cstdint>
#include <string>

#include "xsilo/core/status.h"

namespace xsilo::endpoint {

std::string MakeTicket(const std::string& secret, const std::string& from,
                       const std::string& from_fp, const std::string& to, int64_t expiry_ms);

// PermissionDenied saying why, unless the ticket is for `own_uuid`, unexpired
// at now_ms, signed with `secret`, and names client_fp. On success *from
// (when given) is the UUID the ticket was issued to.
Status VerifyTicket(const std::string& ticket, const std::string& secret,
                    const std::string& own_uuid, const std::string& client_fp, int64_t now_ms,
                    std::string* from = nullptr);

int64_t UnixMillis();
// 32 random bytes as hex (RAND_bytes).
std::string RandomSecret();

}  // namespace xsilo::endpoint
