// `xsilo s3d`: run the embedded S3-compatible server until SIGINT/SIGTERM.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "xsilo/s3/server.h"

namespace xsilo::cli {

namespace {
struct S3dArgs {
  S3ServerOptions options;
  bool memory = false;
  bool no_md5 = false;
  std::string port_file;
  std::string self_signed_dir;
};

// Blocks until SIGINT or SIGTERM arrives; the signals are blocked first so
// no handler is needed.
void WaitForTermination() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  int sig = 0;
  sigwait(&set, &sig);
}
}  // namespace

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
  cmd->add_option("--secret-key", o.secret_key, "the secret key clients sign with");
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
    auto server = S3Server::Start(args->options);
    if (!server.ok()) {
      std::cerr << "s3d: " << server.status().ToString() << "\n";
      std::exit(1);
    }
    std::cout << "s3d: serving on " << (*server)->endpoint() << " (port " << (*server)->port()
              << ", " << (args->options.directory.empty() ? "memory" : args->options.directory)
              << ", region " << args->options.region << ")" << std::endl;
    if (!args->port_file.empty()) {
      std::string tmp = args->port_file + ".tmp";
      FILE* f = std::fopen(tmp.c_str(), "w");
      if (f) {
        std::fprintf(f, "%d\n", (*server)->port());
        std::fclose(f);
        std::rename(tmp.c_str(), args->port_file.c_str());
      }
    }
    WaitForTermination();
    (*server)->Stop();
    std::cout << "s3d: stopped" << std::endl;
  });
}

}  // namespace xsilo::cli
