// libFuzzer target: the embedded S3 server's request-head parser
// (net::ParseHead). Any input is accepted or refused with a reason; an
// accepted head is consistent (a token method, a target starting with '/',
// path and query that rebuild the target, Content-Length as its header
// says) and survives a round trip: written back as HTTP it parses to the
// same request.
#include <cstdint>
#include <string>
#include <string_view>

#include "net/http_parse.h"

using xsilo::net::HttpRequest;
using xsilo::net::ParseHead;
using xsilo::net::ParseResult;

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

std::string Write(const HttpRequest& r, std::string_view version) {
  std::string s = r.method + " " + r.target + " " + std::string(version) + "\r\n";
  for (const auto& [k, v] : r.headers) s += k + ": " + v + "\r\n";
  return s;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view head(reinterpret_cast<const char*>(data), size);
  HttpRequest req;
  std::string why;
  ParseResult r = ParseHead(head, &req, &why);
  if (r != ParseResult::kOk) {
    Check(!why.empty());
    return 0;
  }
  Check(!req.method.empty() && req.method.find(' ') == std::string::npos);
  Check(!req.target.empty() && req.target[0] == '/');
  Check(req.raw_path + (req.target.find('?') == std::string::npos ? "" : "?" + req.raw_query) ==
        req.target);
  const std::string* cl = req.Header("content-length");
  Check(req.has_content_length == (cl != nullptr));
  if (cl) Check(req.content_length == std::stoull(*cl));  // digits only, at most 19
  for (const auto& [k, v] : req.headers) {
    for (char c : k) Check(!(c >= 'A' && c <= 'Z'));
    Check(v.empty() ||
          (v.front() != ' ' && v.front() != '\t' && v.back() != ' ' && v.back() != '\t'));
  }
  // The version is the request line's last word.
  std::string_view line = head.substr(0, head.find("\r\n"));
  std::string_view version = line.substr(line.rfind(' ') + 1);
  HttpRequest again;
  std::string why_again;
  Check(ParseHead(Write(req, version), &again, &why_again) == ParseResult::kOk);
  Check(again.method == req.method && again.target == req.target &&
        again.raw_path == req.raw_path && again.raw_query == req.raw_query &&
        again.headers == req.headers && again.has_content_length == req.has_content_length &&
        again.content_length == req.content_length && again.keep_alive == req.keep_alive);
  return 0;
}
