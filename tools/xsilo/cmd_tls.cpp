// `xsilo tls self-signed`: a certificate and key for a local job's TLS (the
// grpc control plane's tls_cert/tls_key/tls_ca and the embedded object
// server's store.tls_cert/store.tls_key/store.ca_file), where the
// certificate is its own CA.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "commands.h"
#include "xsilo/s3/server.h"

namespace xsilo::cli {

namespace {
struct SelfSignedArgs {
  std::string dir;
  std::vector<std::string> hosts;
  int days = 30;
};
}  // namespace

void AddTlsCommand(CLI::App& app) {
  auto* tls = app.add_subcommand("tls", "TLS helpers");
  tls->require_subcommand(1);
  auto args = std::make_shared<SelfSignedArgs>();
  auto* cmd = tls->add_subcommand(
      "self-signed", "Write a self-signed certificate (cert.pem, its own CA) and key (key.pem)");
  cmd->add_option("--dir", args->dir, "directory to write cert.pem and key.pem to")->required();
  cmd->add_option("--host", args->hosts,
                  "a name or IP address the certificate is for (repeatable; default 127.0.0.1 "
                  "and localhost)");
  cmd->add_option("--days", args->days, "validity in days")->capture_default_str();
  cmd->callback([args] {
    std::error_code ec;
    std::filesystem::create_directories(args->dir, ec);
    if (ec) {
      std::cerr << "tls: cannot create " << args->dir << ": " << ec.message() << "\n";
      std::exit(1);
    }
    std::vector<std::string> hosts = args->hosts;
    if (hosts.empty()) hosts = {"127.0.0.1", "localhost"};
    const std::string cert = args->dir + "/cert.pem", key = args->dir + "/key.pem";
    Status st = GenerateSelfSignedCertificate(cert, key, hosts, args->days);
    if (!st.ok()) {
      std::cerr << "tls: " << st.ToString() << "\n";
      std::exit(1);
    }
    std::cout << cert << "\n" << key << "\n";
  });
}

}  // namespace xsilo::cli
