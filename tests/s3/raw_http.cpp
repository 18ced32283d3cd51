#include "s3/raw_http.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace xsilo::s3::testing {

std::string RawResponse::Header(const std::string& lower_name) const {
  size_t pos = 0;
  while ((pos = head.find("\r\n", pos)) != std::string::npos) {
    pos += 2;
    size_t colon = head.find(':', pos);
    size_t eol = head.find("\r\n", pos);
    if (colon == std::string::npos || colon > eol) continue;
    std::string name = head.substr(pos, colon - pos);
    std::transform(name.begin(), name.end(), name.begin(), ::tolower);
    if (name == lower_name) {
      std::string v = head.substr(colon + 1, eol - colon - 1);
      while (!v.empty() && v.front() == ' ') v.erase(0, 1);
      return v;
    }
  }
  return {};
}

RawResponse RawExchange(int port, const std::string& bytes, int timeout_ms, bool until_close) {
  RawResponse r;
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return r;
  }
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) break;
    off += n;
  }
  std::string in;
  char buf[65536];
  while (true) {
    size_t he = in.find("\r\n\r\n");
    if (he != std::string::npos) {
      std::string head = in.substr(0, he);
      // Skip interim 100 Continue responses.
      if (head.rfind("HTTP/1.1 100", 0) == 0) {
        in.erase(0, he + 4);
        continue;
      }
      RawResponse tmp;
      tmp.head = head;
      std::string cl = tmp.Header("content-length");
      if (!until_close && !cl.empty() && in.size() >= he + 4 + std::stoull(cl)) break;
    }
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) break;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    in.append(buf, n);
  }
  ::close(fd);
  size_t he = in.find("\r\n\r\n");
  if (he == std::string::npos) return r;
  r.head = in.substr(0, he);
  r.body = in.substr(he + 4);
  if (r.head.size() > 12) r.status = std::atoi(r.head.substr(9, 3).c_str());
  return r;
}

std::string SignedRequest(int port, const std::string& method, const std::string& path,
                          const std::string& query, const std::string& body,
                          const std::string& access_key, const std::string& secret_key,
                          const std::string& region, const std::string& payload_hash,
                          const std::string& extra_headers, std::time_t now) {
  std::string host = "127.0.0.1:" + std::to_string(port);
  std::string amz_date = FormatAmzDate(now);
  CanonicalRequestParts p;
  p.method = method;
  p.canonical_uri = CanonicalUri(path);
  Params q;
  ParseQuery(query, &q);
  p.canonical_query = CanonicalQuery(q);
  p.headers = {{"host", host}, {"x-amz-date", amz_date}, {"x-amz-content-sha256", payload_hash}};
  p.payload_hash = payload_hash;
  std::string signed_headers;
  std::string creq = CanonicalRequest(p, &signed_headers);
  std::string date = amz_date.substr(0, 8);
  std::string scope = CredentialScope(date, region, "s3");
  std::string sig = Signature(secret_key, date, region, "s3", StringToSign(amz_date, scope, creq));
  std::string req = method + " " + CanonicalUri(path) + (query.empty() ? "" : "?" + query) +
                    " HTTP/1.1\r\nHost: " + host + "\r\nx-amz-date: " + amz_date +
                    "\r\nx-amz-content-sha256: " + payload_hash +
                    "\r\nAuthorization: AWS4-HMAC-SHA256 Credential=" + access_key + "/" + scope +
                    ", SignedHeaders=" + signed_headers + ", Signature=" + sig +
                    "\r\nContent-Length: " + std::to_string(body.size()) +
                    "\r\nConnection: close\r\n" + extra_headers + "\r\n" + body;
  return req;
}

std::string PresignedTarget(int port, const std::string& method, const std::string& path,
                            const std::string& access_key, const std::string& secret_key,
                            int expires_seconds, std::time_t signed_at, const std::string& region) {
  std::string host = "127.0.0.1:" + std::to_string(port);
  std::string amz_date = FormatAmzDate(signed_at);
  std::string date = amz_date.substr(0, 8);
  std::string scope = CredentialScope(date, region, "s3");
  Params q = {{"X-Amz-Algorithm", "AWS4-HMAC-SHA256"},
              {"X-Amz-Credential", access_key + "/" + scope},
              {"X-Amz-Date", amz_date},
              {"X-Amz-Expires", std::to_string(expires_seconds)},
              {"X-Amz-SignedHeaders", "host"}};
  CanonicalRequestParts p;
  p.method = method;
  p.canonical_uri = CanonicalUri(path);
  p.canonical_query = CanonicalQuery(q);
  p.headers = {{"host", host}};
  p.payload_hash = std::string(kUnsignedPayload);
  std::string creq = CanonicalRequest(p, nullptr);
  std::string sig = Signature(secret_key, date, region, "s3", StringToSign(amz_date, scope, creq));
  return p.canonical_uri + "?" + p.canonical_query + "&X-Amz-Signature=" + sig;
}

}  // namespace xsilo::s3::testing
