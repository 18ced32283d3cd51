// Private: the conditional requests of the embedded S3 server (S3Server):
// the Range header, the preconditions of a read or a copy's source (RFC
// 7232) and the conditions of a write. Pure functions of a request and an
// object, on their own so that they can be fuzzed and tested without a
// server (server_conditions.cpp needs only crypto, errors and sigv4).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "net/http_server.h"
#include "s3/object_store.h"
#include "xsilo/core/status.h"

namespace xsilo::s3server {

// Range header -> [start, start+len). 0: no (usable) range, serve all;
// 1: satisfiable; -1: unsatisfiable (416).
int ParseRange(std::string_view h, uint64_t size, uint64_t* start, uint64_t* len);

// An If-Match / If-None-Match value ("*" or a list of ETags) against an ETag.
bool EtagListMatches(std::string_view list, const std::string& etag);

enum class Precondition { kProceed, kNotModified, kFailed };

// The conditional headers (prefix "" for GET/HEAD, "x-amz-copy-source-" for
// a copy's source) in the order of RFC 7232 section 6, which S3 follows:
// If-Match, else If-Unmodified-Since; then If-None-Match, else
// If-Modified-Since. Dates that do not parse are ignored, as S3 does.
Precondition EvaluatePreconditions(const net::HttpRequest& req, const s3::StoredObject& obj,
                                   std::string_view prefix);

// 412 PreconditionFailed.
Status PreconditionFailed();

// The conditions of a write (PutObject, CopyObject, CompleteMultipartUpload)
// as S3 has them: If-None-Match "*" writes only a key that holds no object;
// If-Match <ETag> only over an object with that ETag (404 NoSuchKey when
// there is none). Both fail with 412 PreconditionFailed. Null without them.
Result<s3::PutCondition> WriteCondition(const net::HttpRequest& req);

}  // namespace xsilo::s3server
