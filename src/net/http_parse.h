// Net layer: the HTTP/1.1 request-head parser of the HttpServer, exposed
// on its own so that it can be fuzzed (fuzz/fuzz_s3_http.cpp) and tested
// without a socket.
#pragma once

#include <string>
#include <string_view>

#include "net/http_server.h"

namespace xsilo::net {

enum class ParseResult { kOk, kBad, kTooLarge };

// Parses a request head: the request line and the header lines, without
// the blank line that ends it (parsing also stops at an empty line). On
// kBad, *why says what was wrong (the text of the 400 answer); *req is
// then partly filled and must not be used.
ParseResult ParseHead(std::string_view head, HttpRequest* req, std::string* why);

}  // namespace xsilo::net
