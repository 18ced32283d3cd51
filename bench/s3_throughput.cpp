// s3_throughput: upload and parallel-download throughput of the S3 client
// against the embedded S3 server on loopback, for K = 1, 4, 8, 16
// connections. Prints a table and writes JSON.
//
//   s3_throughput [--tier big] [--bytes N] [--reps 3] [--k 1,4,8,16]
//                 [--dir D] [--etags md5|xxh3|both] [--json out.json]
//
// Upload: UploadObject with K parts in flight (part size = size / K, at
// least 5 MiB). Download: DownloadObject with K connections. Every download
// is verified (XXH3-64) against the uploaded bytes.
//
// --etags both (the default) runs two servers side by side, one with S3's
// MD5 ETags and one with XXH3 ones (S3ServerOptions::md5_etags), alternating
// rep by rep, and reports the upload ratio: what computing the MD5 costs.
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

// One server and a client for it.
struct Target {
  std::string etags;  // "md5" or "xxh3"
  std::unique_ptr<S3Server> server;
  std::unique_ptr<S3Client> client;
  std::vector<double> up, down;
};

Status StartTarget(Target* t, const std::string& dir) {
  S3ServerOptions so;
  so.access_key = "bench";
  so.secret_key = "bench-secret";
  so.buckets = {"bench"};
  so.directory = dir.empty() ? "" : dir + "/" + t->etags;
  so.md5_etags = t->etags == "md5";
  XSILO_ASSIGN_OR_RETURN(t->server, S3Server::Start(so));
  S3ClientOptions co;
  co.endpoint = t->server->endpoint();
  co.credentials = StaticCredentials({"bench", "bench-secret"});
  co.max_connections = 16;
  XSILO_ASSIGN_OR_RETURN(t->client, S3Client::Create(co));
  return Status::OK();
}

std::string StatsJson(const Stats& s) {
  std::ostringstream o;
  o << "{\"median\": " << s.median << ", \"min\": " << s.min << ", \"max\": " << s.max << "}";
  return o.str();
}

}  // namespace

int main(int argc, char** argv) {
  std::string tier = "big", json_path = "s3_throughput.json", dir, etags = "both";
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
    } else if (a == "--etags") {
      etags = next();
      if (etags != "md5" && etags != "xxh3" && etags != "both") {
        std::cerr << "--etags takes md5, xxh3 or both\n";
        return 2;
      }
    } else if (a == "--k") {
      ks.clear();
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) ks.push_back(std::stoi(item));
    } else {
      std::cerr << "usage: s3_throughput [--tier T] [--bytes N] [--reps R] [--k 1,4,8,16] "
                   "[--dir D] [--etags md5|xxh3|both] [--json PATH]\n";
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

  std::vector<Target> targets;
  for (const char* e : {"md5", "xxh3"}) {
    if (etags == "both" || etags == e) targets.push_back(Target{e, nullptr, nullptr, {}, {}});
  }
  for (Target& t : targets) {
    Status st = StartTarget(&t, dir);
    if (!st.ok()) return Fail("server " + t.etags, st);
  }

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

  std::printf("S3 loopback throughput, object %.1f MB (%s), %d reps, storage %s, ETags %s\n",
              bytes / 1e6, tier.c_str(), reps, dir.empty() ? "memory" : dir.c_str(), etags.c_str());
  std::printf("%4s %5s  %10s %10s %10s   %10s %10s %10s\n", "K", "etag", "up MB/s", "(min)",
              "(max)", "down MB/s", "(min)", "(max)");
  std::ostringstream json;
  json << "{\n  \"benchmark\": \"s3_throughput\",\n  \"object_bytes\": " << bytes
       << ",\n  \"tier\": \"" << tier << "\",\n  \"storage\": \""
       << (dir.empty() ? "memory" : "directory") << "\",\n  \"reps\": " << reps
       << ",\n  \"results\": [";
  bool first = true;
  for (int k : ks) {
    uint64_t part = std::max<uint64_t>(5ull << 20, (bytes + k - 1) / k);
    for (Target& t : targets) t.up.clear(), t.down.clear();
    for (int r = 0; r < reps; ++r) {
      // Alternating servers rep by rep, the first one changing each rep,
      // so that drift on the shared machine falls on both alike.
      for (size_t n = 0; n < targets.size(); ++n) {
        Target& t = targets[(n + r) % targets.size()];
        std::string key = "obj-" + std::to_string(k) + "-" + std::to_string(r);
        auto t0 = Clock::now();
        auto put = t.client->UploadObject(
            {.bucket = "bench", .key = key, .body = body, .part_size = part, .concurrency = k});
        auto t1 = Clock::now();
        if (!put.ok()) return Fail("upload", put.status());
        auto got = t.client->DownloadObject({.bucket = "bench", .key = key, .connections = k});
        auto t2 = Clock::now();
        if (!got.ok()) return Fail("download", got.status());
        if (got->data.size() != bytes || Checksum(got->data.span()) != want) {
          std::cerr << "s3_throughput: downloaded bytes differ from the uploaded ones\n";
          return 1;
        }
        t.up.push_back(bytes / 1e6 / std::chrono::duration<double>(t1 - t0).count());
        t.down.push_back(bytes / 1e6 / std::chrono::duration<double>(t2 - t1).count());
        (void)t.client->DeleteObject({"bench", key});
      }
    }
    json << (first ? "" : ",") << "\n    {\"k\": " << k << ", \"part_bytes\": " << part;
    for (Target& t : targets) {
      Stats u = Summarize(t.up), d = Summarize(t.down);
      std::printf("%4d %5s  %10.1f %10.1f %10.1f   %10.1f %10.1f %10.1f\n", k, t.etags.c_str(),
                  u.median, u.min, u.max, d.median, d.min, d.max);
      json << ", \"" << t.etags << "\": {\"upload_mbps\": " << StatsJson(u)
           << ", \"download_mbps\": " << StatsJson(d) << "}";
    }
    if (targets.size() == 2) {
      // Median of the per-rep ratios of upload times (reps pair up).
      std::vector<double> ratio;
      for (int r = 0; r < reps; ++r) ratio.push_back(targets[1].up[r] / targets[0].up[r]);
      Stats q = Summarize(ratio);
      std::printf("%4d %5s  upload time md5 / xxh3: %.3f (min %.3f, max %.3f)\n", k, "", q.median,
                  q.min, q.max);
      json << ", \"upload_time_ratio_md5_over_xxh3\": " << StatsJson(q);
    }
    json << "}";
    first = false;
  }
  json << "\n  ]\n}\n";
  std::ofstream(json_path) << json.str();
  std::printf("JSON written to %s\n", json_path.c_str());
  return 0;
}
