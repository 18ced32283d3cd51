#include "xsilo/metrics/endpoint.h"

#include <gtest/gtest.h>

#include "metrics/http_get.h"

namespace xsilo::metrics {
namespace {

using testing::HttpGet;

TEST(MetricsEndpoint, ServesTheRegistryAtSlashMetrics) {
  Registry r;
  Counter& c = r.GetCounter("xsilo_things_total", "Things.", {{"peer", "1"}});
  auto ep = MetricsEndpoint::Start(r);  // 127.0.0.1, an ephemeral port
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  ASSERT_GT((*ep)->port(), 0);
  EXPECT_EQ((*ep)->url(), "http://127.0.0.1:" + std::to_string((*ep)->port()) + "/metrics");

  c.Add(7);
  auto reply = HttpGet((*ep)->port(), "/metrics");
  EXPECT_EQ(reply.status, 200);
  EXPECT_NE(reply.headers.find("Content-Type: text/plain; version=0.0.4"), std::string::npos);
  EXPECT_EQ(reply.body, r.Render());
  EXPECT_NE(reply.body.find("xsilo_things_total{peer=\"1\"} 7\n"), std::string::npos);

  c.Add(1);  // every scrape renders afresh
  EXPECT_NE(HttpGet((*ep)->port(), "/metrics?x=1").body.find("xsilo_things_total{peer=\"1\"} 8\n"),
            std::string::npos);
  auto head = HttpGet((*ep)->port(), "/metrics", "HEAD");
  EXPECT_EQ(head.status, 200);
  EXPECT_EQ(head.body, "");
  EXPECT_EQ(HttpGet((*ep)->port(), "/").status, 404);
  EXPECT_EQ(HttpGet((*ep)->port(), "/metrics", "POST").status, 405);
}

// On net::HttpServer: a HEAD announces the length a GET sends, and a 405
// names the methods that are answered.
TEST(MetricsEndpoint, HeadAnnouncesTheBodysLengthAnd405NamesTheMethods) {
  Registry r;
  r.GetCounter("xsilo_things_total", "Things.", {{"peer", "1"}}).Add(3);
  auto ep = MetricsEndpoint::Start(r);
  ASSERT_TRUE(ep.ok()) << ep.status().ToString();
  const auto get = HttpGet((*ep)->port(), "/metrics");
  ASSERT_EQ(get.status, 200);
  const auto head = HttpGet((*ep)->port(), "/metrics", "HEAD");
  ASSERT_EQ(head.status, 200);
  EXPECT_NE(head.headers.find("Content-Length: " + std::to_string(get.body.size())),
            std::string::npos)
      << head.headers;
  const auto post = HttpGet((*ep)->port(), "/metrics", "POST");
  EXPECT_EQ(post.status, 405);
  EXPECT_NE(post.headers.find("Allow: GET, HEAD"), std::string::npos) << post.headers;
}

TEST(MetricsEndpoint, StopIsIdempotentAndClosesThePort) {
  Registry r;
  auto ep = MetricsEndpoint::Start(r);
  ASSERT_TRUE(ep.ok());
  const int port = (*ep)->port();
  (*ep)->Stop();
  (*ep)->Stop();
  EXPECT_EQ(HttpGet(port, "/metrics").status, 0);
}

TEST(MetricsEndpoint, RejectsBadAddresses) {
  Registry r;
  EXPECT_FALSE(MetricsEndpoint::Start(r, {.address = "localhost"}).ok());
  EXPECT_FALSE(MetricsEndpoint::Start(r, {.port = 70000}).ok());
}

}  // namespace
}  // namespace xsilo::metrics

namespace xsilo::metrics {
namespace {

TEST(MetricsEndpoint, ParsesPortArguments) {
  EXPECT_EQ(*ParseMetricsPort(""), std::nullopt);
  EXPECT_EQ(*ParseMetricsPort("0"), std::nullopt);
  EXPECT_EQ(*ParseMetricsPort("auto"), std::optional<int>(0));
  EXPECT_EQ(*ParseMetricsPort("9100"), std::optional<int>(9100));
  EXPECT_FALSE(ParseMetricsPort("-1").ok());
  EXPECT_FALSE(ParseMetricsPort("65536").ok());
  EXPECT_FALSE(ParseMetricsPort("91x").ok());
}

}  // namespace
}  // namespace xsilo::metrics
