// `xsilo relay`: run the endpoints' relay until SIGINT/SIGTERM (docs/endpoint.md).
#include <signal.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "commands.h"
#include "endpoint/relay.h"
#include "net/tls.h"

namespace xsilo::cli {

void AddRelayCommand(CLI::App& app) {
  auto o = std::make_shared<endpoint::RelayOptions>();
  auto self_signed = std::make_shared<std::string>();
  auto ttl_s = std::make_shared<int64_t>(120);
  auto admit_file = std::make_shared<std::string>();
  auto open = std::make_shared<bool>(false);
  auto* cmd = app.add_subcommand("relay", "Vouch for endpoints and relay their sessions");
  cmd->add_option("--listen", o->listen, "address endpoints dial")->capture_default_str();
  cmd->add_option("--tls-cert", o->cert_file, "PEM certificate chain");
  cmd->add_option("--tls-key", o->key_file, "PEM key of --tls-cert");
  cmd->add_option("--tls-self-signed", *self_signed,
                  "a self-signed pair in this directory (cert.pem is what endpoints pass as "
                  "--relay-ca); kept when present");
  cmd->add_option("--admit", *admit_file,
                  "file of the endpoint certificate fingerprints (SHA-256 hex, one per line, "
                  "`xsilo endpoint start` prints its own) that may register");
  cmd->add_flag("--open", *open,
                "admit any endpoint that reaches the relay (it then vouches for whoever "
                "connects: for a trusted network or a test only)");
  cmd->add_option("--ticket-ttl-s", *ttl_s, "lifetime of the tickets it issues")
      ->capture_default_str();
  cmd->add_option("--window-bytes", o->window_bytes,
                  "buffer per direction of a relayed session (all the memory one holds)")
      ->capture_default_str();
  cmd->add_option("--max-connections", o->max_connections,
                  "connections served at once; more are closed when accepted")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->callback([o, self_signed, ttl_s, admit_file, open] {
    if (admit_file->empty() == !*open) {
      std::cerr << "relay: give --admit FILE (the endpoints that may register) or --open\n";
      std::exit(2);
    }
    if (!admit_file->empty()) {
      std::ifstream in(*admit_file);
      if (!in) {
        std::cerr << "relay: cannot read " << *admit_file << "\n";
        std::exit(2);
      }
      for (std::string line; std::getline(in, line);) {
        line = line.substr(0, line.find('#'));
        line.erase(0, line.find_first_not_of(" \t\r"));
        line.erase(line.find_last_not_of(" \t\r") + 1);
        if (line.empty()) continue;
        if (line.size() != 64 || line.find_first_not_of("0123456789abcdef") != std::string::npos) {
          std::cerr << "relay: " << *admit_file << ": '" << line
                    << "' is not a SHA-256 fingerprint (64 lowercase hex digits)\n";
          std::exit(2);
        }
        o->admit.insert(line);
      }
      if (o->admit.empty()) {
        std::cerr << "relay: " << *admit_file << " admits no endpoint\n";
        std::exit(2);
      }
    }
    if (!self_signed->empty()) {
      if (!o->cert_file.empty() || !o->key_file.empty()) {
        std::cerr << "relay: --tls-self-signed and --tls-cert/--tls-key are exclusive\n";
        std::exit(2);
      }
      o->cert_file = *self_signed + "/cert.pem";
      o->key_file = *self_signed + "/key.pem";
      if (!std::filesystem::exists(o->cert_file)) {
        std::error_code ec;
        std::filesystem::create_directories(*self_signed, ec);
        std::string host = o->listen.substr(0, o->listen.rfind(':'));
        std::vector<std::string> hosts = {"127.0.0.1", "localhost"};
        if (!host.empty() && host != "0.0.0.0" && host != "127.0.0.1") {
          hosts.insert(hosts.begin(), host);
        }
        Status st = net::GenerateSelfSignedCertificate(o->cert_file, o->key_file, hosts, 3650);
        if (!st.ok()) {
          std::cerr << "relay: " << st.ToString() << "\n";
          std::exit(1);
        }
      }
    }
    if (o->cert_file.empty() || o->key_file.empty() || o->window_bytes == 0) {
      std::cerr << "relay: needs --tls-cert and --tls-key, or --tls-self-signed DIR\n";
      std::exit(2);
    }
    o->ticket_ttl = std::chrono::seconds(*ttl_s);
    auto r = endpoint::Relay::Start(*o);
    if (!r.ok()) {
      std::cerr << "relay: " << r.status().ToString() << "\n";
      std::exit(1);
    }
    std::cout << "relay on port " << (*r)->port() << ", certificate " << (*r)->fingerprint() << " ("
              << o->cert_file << ")" << std::endl;
    WaitForTermination();
    (*r)->Stop();
  });
}

}  // namespace xsilo::cli
