// Conditional requests: Range, read preconditions, write conditions.
#include "s3/server_conditions.h"

#include <algorithm>
#include <ctime>
#include <optional>

#include "net/crypto.h"
#include "s3/errors.h"
#include "s3/sigv4.h"

namespace xsilo::s3server {

using net::HttpRequest;
using s3::ObjectEntry;
using s3::PutCondition;
using s3::S3Error;
using s3::StoredObject;

int ParseRange(std::string_view h, uint64_t size, uint64_t* start, uint64_t* len) {
  if (h.substr(0, 6) != "bytes=") return 0;
  h.remove_prefix(6);
  if (h.find(',') != std::string_view::npos) return 0;  // multiple ranges: whole object
  size_t dash = h.find('-');
  if (dash == std::string_view::npos) return 0;
  std::string_view a = h.substr(0, dash), b = h.substr(dash + 1);
  auto digits = [](std::string_view s) {
    return !s.empty() && s.size() <= 19 &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  if (a.empty()) {
    if (!digits(b)) return 0;
    uint64_t n = std::stoull(std::string(b));
    if (n == 0 || size == 0) return -1;
    n = std::min(n, size);
    *start = size - n;
    *len = n;
    return 1;
  }
  if (!digits(a) || (!b.empty() && !digits(b))) return 0;
  uint64_t first = std::stoull(std::string(a));
  uint64_t last = b.empty() ? UINT64_MAX : std::stoull(std::string(b));
  if (last < first) return 0;
  if (first >= size) return -1;
  last = std::min(last, size - 1);
  *start = first;
  *len = last - first + 1;
  return 1;
}

bool EtagListMatches(std::string_view list, const std::string& etag) {
  std::string_view want = etag;
  if (want.size() >= 2 && want.front() == '"') want = want.substr(1, want.size() - 2);
  while (!list.empty()) {
    size_t comma = list.find(',');
    std::string_view item = net::TrimOws(list.substr(0, comma));
    list = comma == std::string_view::npos ? std::string_view() : list.substr(comma + 1);
    if (item == "*") return true;
    if (item.substr(0, 2) == "W/") item.remove_prefix(2);
    if (item.size() >= 2 && item.front() == '"' && item.back() == '"') {
      item = item.substr(1, item.size() - 2);
    }
    if (item == want) return true;
  }
  return false;
}

Precondition EvaluatePreconditions(const HttpRequest& req, const StoredObject& obj,
                                   std::string_view prefix) {
  auto header = [&](std::string_view name) {
    return req.Header(std::string(prefix) + std::string(name));
  };
  std::time_t t = 0;
  if (const std::string* v = header("if-match")) {
    if (!EtagListMatches(*v, obj.etag)) return Precondition::kFailed;
  } else if (const std::string* d = header("if-unmodified-since")) {
    if (s3::ParseHttpDate(*d, &t) && obj.mtime > t) return Precondition::kFailed;
  }
  if (const std::string* v = header("if-none-match")) {
    if (EtagListMatches(*v, obj.etag)) return Precondition::kNotModified;
  } else if (const std::string* d = header("if-modified-since")) {
    if (s3::ParseHttpDate(*d, &t) && obj.mtime <= t) return Precondition::kNotModified;
  }
  return Precondition::kProceed;
}

Status PreconditionFailed() {
  return S3Error("PreconditionFailed",
                 "At least one of the pre-conditions you specified did not hold");
}

Result<PutCondition> WriteCondition(const HttpRequest& req) {
  const std::string* none = req.Header("if-none-match");
  const std::string* match = req.Header("if-match");
  if (none == nullptr && match == nullptr) return PutCondition();
  if (none != nullptr && net::TrimOws(*none) != "*") {
    return S3Error("NotImplemented",
                   "A header you provided implies functionality that is not implemented: "
                   "If-None-Match on a write takes only *");
  }
  const bool absent = none != nullptr;
  std::optional<std::string> etag;
  if (match != nullptr) etag = *match;
  return PutCondition([absent, etag](const ObjectEntry* current) -> Status {
    if (absent && current != nullptr) return PreconditionFailed();
    if (etag) {
      if (current == nullptr) return S3Error("NoSuchKey", "The specified key does not exist.");
      if (!EtagListMatches(*etag, current->etag)) return PreconditionFailed();
    }
    return Status::OK();
  });
}

}  // namespace xsilo::s3server
