// s3_throughput: upload and parallel-download throughput of the S3 client
// against the embedded S3 server on loopback, for K = 1, 4, 8, 16
// connections. Prints a table and writes JSON.
//
//   s3_throughput [--tier big] [--bytes N] [--reps 3] [--k 1,4,8,16]
//                 [--dir D] [--json out.json]
//
// Upload: UploadObject with K parts in flight (part size = size / K, at
// least 5 MiB). Download: DownloadObject with K connections. Every download
// is verified (XXH3-64) against the uploaded bytes.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "xsilo/core/codec.h"
#include "xsilo/core/tiers.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/server.h"

using namespace xsilo;
using Clock = std::chrono::steady_clock;

namespace {

struct Stats {
  double min = 0, median = 0, max = 0;
};

Stats Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.front(), v[v.size() / 2], v.back()};
}

int Fail(const std::string& what, const Status& st) {
  std::cerr << "s3_throughput: " << what << ": " << st.ToString() << "\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tier = "big", json_path = "s3_throughput.json", dir;
  uint64_t bytes = 0;
  int reps = 3;
  std::vector<int> ks = {1, 4, 8, 16};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--tier") {
      tier = next();
    } else if (a == "--bytes") {
      bytes = std::stoull(next());
    } else if (a == "--reps") {
      reps = std::max(1, std::stoi(next()));
    } else if (a == "--json") {
      json_path = next();
    } else if (a == "--dir") {
      dir = next();
    } else if (a == "--k") {
      ks.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) ks.push_back(std::stoi(item));
    } else {
      std::cerr << "usage: s3_throughput [--tier T] [--bytes N] [--reps R] [--k 1,4,8,16] "
                   "[--dir D] [--json PATH]\n";
      return 2;
    }
  }
  if (bytes == 0) {
    auto t = FindTier(tier);
    if (!t) {
      std::cerr << "unknown tier " << tier << "\n";
      return 2;
    }
    bytes = t->parameters * 4;
  }

  S3ServerOptions so;
  so.access_key = "bench";
  so.secret_key = "bench-secret";
  so.buckets = {"bench"};
  so.directory = dir;
  auto server = S3Server::Start(so);
  if (!server.ok()) return Fail("server", server.status());
  S3ClientOptions co;
  co.endpoint = (*server)->endpoint();
  co.credentials = StaticCredentials({"bench", "bench-secret"});
  co.max_connections = 16;
  auto client = S3Client::Create(co);
  if (!client.ok()) return Fail("client", client.status());

  auto data = Buffer::Allocate(bytes);
  if (!data.ok()) return Fail("allocate", data.status());
  uint64_t x = 0x9E3779B97F4A7C15ull;
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(data->mutable_data() + i, &x, 8);
  }
  const uint64_t want = Checksum(data->span());
  GatherList body;
  body.Append(*data);

  std::printf("S3 loopback throughput, object %.1f MB (%s), %d reps, storage %s\n", bytes / 1e6,
              tier.c_str(), reps, dir.empty() ? "memory" : dir.c_str());
  std::printf("%4s  %10s %10s %10s   %10s %10s %10s\n", "K", "up MB/s", "(min)", "(max)",
              "down MB/s", "(min)", "(max)");
  std::ostringstream json;
  json << "{\n  \"benchmark\": \"s3_throughput\",\n  \"object_bytes\": " << bytes
       << ",\n  \"tier\": \"" << tier << "\",\n  \"storage\": \""
       << (dir.empty() ? "memory" : "directory") << "\",\n  \"reps\": " << reps
       << ",\n  \"results\": [";
  bool first = true;
  for (int k : ks) {
    std::vector<double> up, down;
    uint64_t part = std::max<uint64_t>(5ull << 20, (bytes + k - 1) / k);
    for (int r = 0; r < reps; ++r) {
      std::string key = "obj-" + std::to_string(k) + "-" + std::to_string(r);
      auto t0 = Clock::now();
      auto put = (*client)->UploadObject(
          {.bucket = "bench", .key = key, .body = body, .part_size = part, .concurrency = k});
      auto t1 = Clock::now();
      if (!put.ok()) return Fail("upload", put.status());
      auto got = (*client)->DownloadObject({.bucket = "bench", .key = key, .connections = k});
      auto t2 = Clock::now();
      if (!got.ok()) return Fail("download", got.status());
      if (got->data.size() != bytes || Checksum(got->data.span()) != want) {
        std::cerr << "s3_throughput: downloaded bytes differ from the uploaded ones\n";
        return 1;
      }
      up.push_back(bytes / 1e6 / std::chrono::duration<double>(t1 - t0).count());
      down.push_back(bytes / 1e6 / std::chrono::duration<double>(t2 - t1).count());
      (void)(*client)->DeleteObject({"bench", key});
    }
    Stats u = Summarize(up), d = Summarize(down);
    std::printf("%4d  %10.1f %10.1f %10.1f   %10.1f %10.1f %10.1f\n", k, u.median, u.min, u.max,
                d.median, d.min, d.max);
    json << (first ? "" : ",") << "\n    {\"k\": " << k << ", \"part_bytes\": " << part
         << ", \"upload_mbps\": {\"median\": " << u.median << ", \"min\": " << u.min
         << ", \"max\": " << u.max << "}, \"download_mbps\": {\"median\": " << d.median
         << ", \"min\": " << d.min << ", \"max\": " << d.max << "}}";
    first = false;
  }
  json << "\n  ]\n}\n";
  std::ofstream(json_path) << json.str();
  std::printf("JSON written to %s\n", json_path.c_str());
  return 0;
}
