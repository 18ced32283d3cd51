// The request and response model's helpers and the request-head parser
// (http_parse.h): pure, no socket, fuzzed by fuzz/fuzz_s3_http.cpp.
#include "net/http_parse.h"

#include <algorithm>
#include <cctype>
#include <cstring>

#include "net/crypto.h"

namespace xsilo::net {

const std::string* HttpRequest::Header(std::string_view lower_name) const {
  for (const auto& [k, v] : headers) {
    if (k == lower_name) return &v;
  }
  return nullptr;
}

void HttpResponse::ClearFile() {
  file_fd = -1;
  file_offset = file_length = 0;
  file_owner.reset();
}

void HttpResponse::SetBody(std::string text) {
  ClearFile();
  body.clear();
  if (!text.empty()) body.push_back(Buffer::CopyFrom(text));
  content_length = text.size();
}

void HttpResponse::SetBody(std::vector<Buffer> segments) {
  ClearFile();
  body = std::move(segments);
  content_length = 0;
  for (const Buffer& b : body) content_length += b.size();
}

namespace {

bool IsTokenChar(unsigned char c) {
  return std::isalnum(c) || std::strchr("!#$%&'*+-.^_`|~", c) != nullptr;
}

}  // namespace

ParseResult ParseHead(std::string_view head, HttpRequest* req, std::string* why) {
  size_t eol = head.find("\r\n");
  std::string_view line = head.substr(0, eol);
  size_t sp1 = line.find(' ');
  size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string_view::npos || sp2 == std::string_view::npos || sp1 == 0) {
    *why = "malformed request line";
    return ParseResult::kBad;
  }
  std::string_view method = line.substr(0, sp1);
  std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  std::string_view version = line.substr(sp2 + 1);
  if (!std::all_of(method.begin(), method.end(), [](unsigned char c) { return IsTokenChar(c); })) {
    *why = "malformed method";
    return ParseResult::kBad;
  }
  if (target.empty() || target[0] != '/' ||
      std::any_of(target.begin(), target.end(),
                  [](unsigned char c) { return c <= 0x20 || c == 0x7f; })) {
    *why = "malformed request target";
    return ParseResult::kBad;
  }
  if (version != "HTTP/1.1" && version != "HTTP/1.0") {
    *why = "unsupported HTTP version";
    return ParseResult::kBad;
  }
  req->method = method;
  req->target = target;
  size_t q = target.find('?');
  req->raw_path = target.substr(0, q);
  req->raw_query = q == std::string_view::npos ? std::string() : std::string(target.substr(q + 1));
  req->keep_alive = version == "HTTP/1.1";

  std::string_view rest = eol == std::string_view::npos ? std::string_view() : head.substr(eol + 2);
  while (!rest.empty()) {
    size_t e = rest.find("\r\n");
    std::string_view h = rest.substr(0, e);
    rest = e == std::string_view::npos ? std::string_view() : rest.substr(e + 2);
    if (h.empty()) break;
    size_t colon = h.find(':');
    if (colon == std::string_view::npos || colon == 0 ||
        !std::all_of(h.begin(), h.begin() + colon,
                     [](unsigned char c) { return IsTokenChar(c); })) {
      *why = "malformed header line";
      return ParseResult::kBad;
    }
    std::string name(h.substr(0, colon));
    std::transform(name.begin(), name.end(), name.begin(),
                   [](unsigned char c) { return std::tolower(c); });
    std::string_view value = TrimOws(h.substr(colon + 1));
    if (std::any_of(value.begin(), value.end(),
                    [](unsigned char c) { return c == '\r' || c == '\n' || c == 0; })) {
      *why = "malformed header value";
      return ParseResult::kBad;
    }
    if (name == "content-length") {
      if (value.empty() || value.size() > 19 ||
          !std::all_of(value.begin(), value.end(), [](char c) { return c >= '0' && c <= '9'; })) {
        *why = "malformed Content-Length";
        return ParseResult::kBad;
      }
      uint64_t len = std::stoull(std::string(value));
      if (req->has_content_length && len != req->content_length) {
        *why = "conflicting Content-Length headers";
        return ParseResult::kBad;
      }
      req->has_content_length = true;
      req->content_length = len;
    } else if (name == "connection") {
      std::string v(value);
      std::transform(v.begin(), v.end(), v.begin(),
                     [](unsigned char c) { return std::tolower(c); });
      if (v.find("close") != std::string::npos) req->keep_alive = false;
      if (v.find("keep-alive") != std::string::npos) req->keep_alive = true;
    }
    req->headers.emplace_back(std::move(name), std::string(value));
  }
  return ParseResult::kOk;
}

}  // namespace xsilo::net
