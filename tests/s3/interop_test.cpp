// Software we did not write against the embedded server: boto3 and the curl
// command line (--aws-sigv4).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "xsilo/s3/server.h"

namespace xsilo {
namespace {

std::string Python3WithBoto3() {
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    std::string cmd = std::string(py) + " -c 'import boto3' >/dev/null 2>&1";
    if (std::system(cmd.c_str()) == 0) return py;
  }
  return {};
}

class InteropTest : public ::testing::Test {
 protected:
  void SetUp() override {
    S3ServerOptions o;
    o.access_key = "interop-ak";
    o.secret_key = "interop-sk";
    o.buckets = {"interop"};
    auto s = S3Server::Start(o);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(s).value();
  }
  std::unique_ptr<S3Server> server_;
};

TEST_F(InteropTest, Boto3) {
  std::string py = Python3WithBoto3();
  // scripts/install-deps.sh installs python3-boto3: its absence is a failure.
  ASSERT_FALSE(py.empty()) << "no python3 with boto3 (Debian: python3-boto3)";
  std::string cmd = py + " " XSILO_S3_TEST_DIR "/boto3_interop.py " + server_->endpoint() +
                    " interop-ak interop-sk interop";
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST_F(InteropTest, CurlAwsSigv4) {
  auto dir = std::filesystem::temp_directory_path() / ("xsilo-curl-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::string in = (dir / "in").string(), out = (dir / "out").string();
  {
    std::ofstream f(in, std::ios::binary);
    for (int i = 0; i < 200000; ++i) f << i << ',';
  }
  std::string base = "curl -sf --aws-sigv4 aws:amz:us-east-1:s3 --user interop-ak:interop-sk ";
  std::string url = server_->endpoint() + "/interop/curl/object";
  // curl 7.88 does not send x-amz-content-sha256 itself; S3 wants it for uploads.
  EXPECT_EQ(std::system(
                (base + "-H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' -T '" + in + "' '" + url + "'")
                    .c_str()),
            0);
  EXPECT_EQ(std::system((base + "-o '" + out + "' '" + url + "'").c_str()), 0);
  std::ifstream a(in, std::ios::binary), b(out, std::ios::binary);
  std::string sa((std::istreambuf_iterator<char>(a)), {}),
      sb((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(sa, sb);
  EXPECT_GT(sa.size(), 1000000u);
  // The wrong secret is refused (-f: non-zero exit on HTTP >= 400).
  std::string bad =
      "curl -sf -o /dev/null --aws-sigv4 aws:amz:us-east-1:s3 --user interop-ak:wrong '" + url +
      "'";
  EXPECT_NE(std::system(bad.c_str()), 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace xsilo
