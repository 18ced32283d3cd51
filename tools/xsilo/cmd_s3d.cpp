// `xsilo s3d`: run the embedded S3-compatible server until SIGINT/SIGTERM.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <mutex>
#include <set>

#include "commands.h"
#include "xsilo/core/secret.h"
#include "xsilo/metrics/endpoint.h"
#include "xsilo/s3/client.h"
#include "xsilo/s3/credentials.h"
#include "xsilo/s3/server.h"

namespace xsilo::cli {

namespace {
struct S3dArgs {
  S3ServerOptions options;
  bool memory = false;
  bool no_md5 = false;
  std::string port_file;
  std::string secret_key_file;
  std::string self_signed_dir;
  std::string metrics_port;  // "" or "0": off; "auto": an ephemeral port
  std::string metrics_address = "127.0.0.1";
  std::string metrics_port_file;
};

// s3d's metrics (docs/metrics.md): requests by method, counted from the
// server's on_request hook, and the objects and bytes of each bucket, read
// from the server itself by listing (at most once a second, at scrape
// time). Buckets are those of --bucket and any a PUT or POST named.
class S3dMetrics {
 public:
  S3dMetrics(const std::vector<std::string>& buckets) : buckets_(buckets.begin(), buckets.end()) {
    for (const char* m : {"GET", "HEAD", "PUT", "POST", "DELETE", "OPTIONS", "other"}) {
      requests_[m] = &registry_.GetCounter("xsilo_s3d_requests_total",
                                           "Requests received, by method (scrapes list buckets, "
                                           "one GET per bucket at most once a second).",
                                           {{"method", m}});
    }
  }

  // For S3ServerOptions::on_request. Takes no registry lock: a scrape holds
  // it while it lists buckets through this same server.
  void OnRequest(const S3FaultRequest& r) {
    auto it = requests_.find(r.method);
    (it == requests_.end() ? requests_.at("other") : it->second)->Add();
    if (r.method != "PUT" && r.method != "POST") return;
    const size_t start = r.path.find_first_not_of('/');
    if (start == std::string::npos) return;
    const std::string bucket = r.path.substr(start, r.path.find('/', start) - start);
    std::lock_guard<std::mutex> lock(mu_);
    buckets_.insert(bucket);
  }

  Status Serve(const S3Server& server, const S3ServerOptions& o, const std::string& address,
               int port) {
    S3ClientOptions c;
    c.endpoint = server.endpoint();
    c.region = o.region;
    c.credentials = StaticCredentials({o.access_key, o.secret_key});
    c.verify_tls = false;  // our own server, on this host
    c.max_retries = 0;
    c.max_connections = 2;
    XSILO_ASSIGN_OR_RETURN(client_, S3Client::Create(c));
    auto collect = [this](bool bytes) {
      return [this, bytes] {
        std::lock_guard<std::mutex> lock(mu_);
        Refresh();
        std::vector<metrics::Sample> out;
        for (const auto& [bucket, usage] : usage_) {
          out.push_back(
              {{{"bucket", bucket}}, static_cast<double>(bytes ? usage.second : usage.first)});
        }
        return out;
      };
    };
    collectors_.push_back(registry_.AddCollector("xsilo_s3d_store_objects", "Objects per bucket.",
                                                 metrics::MetricType::kGauge, collect(false)));
    collectors_.push_back(registry_.AddCollector("xsilo_s3d_store_bytes",
                                                 "Bytes of the objects per bucket.",
                                                 metrics::MetricType::kGauge, collect(true)));
    collectors_.push_back(registry_.AddCollector(
        "xsilo_s3d_store_list_errors_total", "Bucket listings for these metrics that failed.",
        metrics::MetricType::kCounter, [this] {
          std::lock_guard<std::mutex> lock(mu_);
          return std::vector<metrics::Sample>{{{}, static_cast<double>(list_errors_)}};
        }));
    XSILO_ASSIGN_OR_RETURN(
        endpoint_, metrics::MetricsEndpoint::Start(registry_, {.address = address, .port = port}));
    return Status::OK();
  }

  const metrics::MetricsEndpoint& endpoint() const { return *endpoint_; }

  void Stop() {
    if (endpoint_) endpoint_->Stop();
    for (int id : collectors_) registry_.RemoveCollector(id);
    collectors_.clear();
  }

 private:
  // Lists every known bucket if the last listing is older than a second.
  void Refresh() {
    const auto now = std::chrono::steady_clock::now();
    if (listed_ && now - listed_at_ < std::chrono::seconds(1)) return;
    listed_ = true;
    listed_at_ = now;
    usage_.clear();
    for (auto it = buckets_.begin(); it != buckets_.end();) {
      auto list = client_->ListObjects({.bucket = *it, .fetch_all = true});
      if (!list.ok()) {
        if (list.status().code() != StatusCode::kNotFound) ++list_errors_;
        it = list.status().code() == StatusCode::kNotFound ? buckets_.erase(it) : std::next(it);
        continue;
      }
      auto& u = usage_[*it];
      for (const auto& obj : list->objects) {
        ++u.first;
        u.second += obj.size;
      }
      ++it;
    }
  }

  metrics::Registry registry_;
  std::map<std::string, metrics::Counter*> requests_;
  std::unique_ptr<S3Client> client_;
  std::unique_ptr<metrics::MetricsEndpoint> endpoint_;
  std::vector<int> collectors_;
  std::mutex mu_;
  std::set<std::string> buckets_;
  std::map<std::string, std::pair<uint64_t, uint64_t>> usage_;  // objects, bytes
  uint64_t list_errors_ = 0;
  bool listed_ = false;
  std::chrono::steady_clock::time_point listed_at_;
};

void WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  FILE* f = std::fopen(tmp.c_str(), "w");
  if (f) {
    std::fprintf(f, "%d\n", port);
    std::fclose(f);
    std::rename(tmp.c_str(), path.c_str());
  }
}

}  // namespace

void WaitForTermination() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
}

void AddS3dCommand(CLI::App& app) {
  auto args = std::make_shared<S3dArgs>();
  auto* cmd = app.add_subcommand("s3d", "Run the embedded S3-compatible object server");
  S3ServerOptions& o = args->options;
  cmd->add_option("--host", o.host, "IPv4 address to bind")->capture_default_str();
  cmd->add_option("--port", o.port, "TCP port (0: ephemeral, printed at start)")
      ->capture_default_str();
  cmd->add_option("--dir", o.directory, "keep objects in this directory");
  cmd->add_flag("--memory", args->memory, "keep objects in memory (default when --dir is absent)");
  cmd->add_option("--access-key", o.access_key, "the access key clients sign with");
  cmd->add_option("--secret-key", o.secret_key,
                  "the secret key clients sign with (visible to `ps`: prefer --secret-key-file "
                  "or AWS_SECRET_ACCESS_KEY)");
  cmd->add_option("--secret-key-file", args->secret_key_file,
                  "read the secret key from this file (mode 600)");
  cmd->add_option("--region", o.region, "region requests are signed for")->capture_default_str();
  cmd->add_option("--bucket", o.buckets, "create this bucket at start (repeatable)");
  cmd->add_option("--max-connections", o.max_connections, "connections served at once")
      ->capture_default_str();
  cmd->add_option("--max-object-bytes", o.max_object_bytes, "largest object accepted")
      ->capture_default_str();
  cmd->add_option("--virtual-host-domain", o.virtual_host_domain,
                  "accept <bucket>.<domain> Host headers (virtual-hosted style)");
  cmd->add_flag("--allow-anonymous", o.allow_anonymous, "accept unsigned requests too");
  cmd->add_option("--port-file", args->port_file, "write the bound port to this file");
  cmd->add_option("--metrics-port", args->metrics_port,
                  "serve Prometheus metrics at http://<metrics-address>:<port>/metrics (0: off; "
                  "'auto': an ephemeral port, printed and written to --metrics-port-file)");
  cmd->add_option("--metrics-address", args->metrics_address,
                  "IPv4 address the metrics endpoint binds")
      ->capture_default_str();
  cmd->add_option("--metrics-port-file", args->metrics_port_file,
                  "write the metrics endpoint's bound port to this file");
  cmd->add_option("--tls-cert", o.tls_cert_file, "serve HTTPS with this PEM certificate chain");
  cmd->add_option("--tls-key", o.tls_key_file, "the PEM key of --tls-cert");
  cmd->add_option("--tls-self-signed", args->self_signed_dir,
                  "serve HTTPS with a fresh self-signed pair written to this directory "
                  "(cert.pem, which clients trust as their CA file, and key.pem)");
  cmd->add_flag("--xxh3-etags", args->no_md5,
                "XXH3 instead of MD5 ETags: cheaper, for xsilo clients only (rclone, s3cmd and "
                "aws s3 sync check ETags as MD5)");
  cmd->callback([args] {
    if (args->memory && !args->options.directory.empty()) {
      std::cerr << "s3d: --memory and --dir are exclusive\n";
      std::exit(2);
    }
    if (args->options.access_key.empty()) {
      if (const char* k = std::getenv("AWS_ACCESS_KEY_ID")) args->options.access_key = k;
    }
    if (!args->secret_key_file.empty()) {
      if (!args->options.secret_key.empty()) {
        std::cerr << "s3d: --secret-key and --secret-key-file are exclusive\n";
        std::exit(2);
      }
      auto secret = ReadSecretFile(args->secret_key_file);
      if (!secret.ok()) {
        std::cerr << "s3d: " << secret.status().message() << "\n";
        std::exit(2);
      }
      args->options.secret_key = *secret;
    }
    if (args->options.secret_key.empty()) {
      if (const char* s = std::getenv("AWS_SECRET_ACCESS_KEY")) args->options.secret_key = s;
    }
    args->options.md5_etags = !args->no_md5;
    if (!args->self_signed_dir.empty()) {
      if (!args->options.tls_cert_file.empty() || !args->options.tls_key_file.empty()) {
        std::cerr << "s3d: --tls-self-signed and --tls-cert/--tls-key are exclusive\n";
        std::exit(2);
      }
      std::error_code ec;
      std::filesystem::create_directories(args->self_signed_dir, ec);
      args->options.tls_cert_file = args->self_signed_dir + "/cert.pem";
      args->options.tls_key_file = args->self_signed_dir + "/key.pem";
      std::vector<std::string> hosts = {"127.0.0.1", "localhost"};
      if (args->options.host != "0.0.0.0" && args->options.host != "127.0.0.1") {
        hosts.insert(hosts.begin(), args->options.host);
      }
      Status st = GenerateSelfSignedCertificate(args->options.tls_cert_file,
                                                args->options.tls_key_file, hosts);
      if (!st.ok()) {
        std::cerr << "s3d: " << st.ToString() << "\n";
        std::exit(1);
      }
      std::cout << "s3d: self-signed certificate " << args->options.tls_cert_file
                << " (clients: --ca-bundle / ca_file)" << std::endl;
    }
    std::unique_ptr<S3dMetrics> metrics;
    auto metrics_port = metrics::ParseMetricsPort(args->metrics_port);
    if (!metrics_port.ok()) {
      std::cerr << "s3d: " << metrics_port.status().ToString() << "\n";
      std::exit(2);
    }
    if (*metrics_port) {
      metrics = std::make_unique<S3dMetrics>(args->options.buckets);
      args->options.on_request = [m = metrics.get()](const S3FaultRequest& r) { m->OnRequest(r); };
    }
    auto server = S3Server::Start(args->options);
    if (!server.ok()) {
      std::cerr << "s3d: " << server.status().ToString() << "\n";
      std::exit(1);
    }
    if (metrics) {
      Status st = metrics->Serve(**server, args->options, args->metrics_address, **metrics_port);
      if (!st.ok()) {
        std::cerr << "s3d: metrics: " << st.ToString() << "\n";
        std::exit(1);
      }
      std::cout << "s3d: metrics at " << metrics->endpoint().url() << std::endl;
      if (!args->metrics_port_file.empty()) {
        WritePortFile(args->metrics_port_file, metrics->endpoint().port());
      }
    }
    std::cout << "s3d: serving on " << (*server)->endpoint() << " (port " << (*server)->port()
              << ", " << (args->options.directory.empty() ? "memory" : args->options.directory)
              << ", region " << args->options.region << ")" << std::endl;
    if (!args->port_file.empty()) WritePortFile(args->port_file, (*server)->port());
    WaitForTermination();
    if (metrics) metrics->Stop();  // before the server its listings go to
    (*server)->Stop();
    std::cout << "s3d: stopped" << std::endl;
  });
}

}  // namespace xsilo::cli
