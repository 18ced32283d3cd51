// `xsilo endpoint start`: run a per-site object endpoint until SIGINT/SIGTERM
// (docs/endpoint.md); `xsilo endpoint status`: print a running one's status.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "endpoint/endpoint.h"
#include "net/http_client.h"
#include "xsilo/core/secret.h"

namespace xsilo::cli {

namespace {

struct EndpointArgs {
  endpoint::EndpointOptions options;
  int64_t connect_timeout_ms = 1000;
  int64_t io_timeout_ms = 60000;
  int64_t punch_timeout_ms = 5000;
  bool no_punch = false;
  std::string port_file;
  std::string token_file;           // the local API's token (start and status)
  std::vector<std::string> grants;  // --grant READER:PREFIX
  std::string status_address = "127.0.0.1:7070";
};

}  // namespace

void AddEndpointCommand(CLI::App& app) {
  auto args = std::make_shared<EndpointArgs>();
  auto* cmd = app.add_subcommand("endpoint", "Per-site object endpoint (docs/endpoint.md)");
  cmd->require_subcommand(1);
  auto* start = cmd->add_subcommand("start", "Run an endpoint until SIGINT/SIGTERM");
  endpoint::EndpointOptions& o = args->options;
  start
      ->add_option("--listen", o.listen,
                   "local API address (HTTP; one that is not loopback needs --token-file)")
      ->capture_default_str();
  start->add_option("--token-file", args->token_file,
                    "a file (mode 600) whose token every local API call must carry; connectors "
                    "read it through their token_file option");
  start->add_option("--peer-listen", o.peer_listen,
                    "peer API address (TLS); none: reachable only through the relay");
  start->add_option("--advertise", o.advertise,
                    "address peers dial (repeatable; default: the --peer-listen address)");
  start->add_option("--relay", o.relay, "the relay's HOST:PORT");
  start->add_option("--relay-ca", o.relay_ca, "PEM file to verify the relay's certificate with");
  start->add_option("--dir", o.dir, "keep objects, the uuid and the TLS identity here");
  start->add_option("--max-bytes", o.max_bytes, "bound on stored bytes (0: none)")
      ->capture_default_str();
  start->add_option("--uuid-file", o.uuid_file, "where the uuid is kept (default <dir>/uuid)");
  start
      ->add_option("--connect-timeout-ms", args->connect_timeout_ms,
                   "a direct dial to a peer, and to the relay")
      ->capture_default_str();
  start->add_option("--io-timeout-ms", args->io_timeout_ms, "each blocked send/recv")
      ->capture_default_str();
  start
      ->add_option("--punch-timeout-ms", args->punch_timeout_ms,
                   "ICE checks of a hole-punched path before falling back to the relay's pipe")
      ->capture_default_str();
  start->add_option("--max-sessions", o.max_sessions, "peer sessions served at once")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  start->add_flag("--no-punch", args->no_punch,
                  "never try a hole-punched UDP path (the relay's pipe when no side can dial)");
  start->add_option("--grant", args->grants,
                    "READER:PREFIX: peer READER (an endpoint uuid, or * for every peer the "
                    "relay vouches for) may read this endpoint's objects whose ids start with "
                    "PREFIX (empty: all); repeatable");
  start->add_option("--port-file", args->port_file, "write the local API's port to this file");
  start->callback([args] {
    for (const std::string& g : args->grants) {
      const size_t colon = g.find(':');
      if (colon == std::string::npos || colon == 0) {
        std::cerr << "endpoint: --grant " << g << ": expected READER:PREFIX\n";
        std::exit(2);
      }
      args->options.read_grants.push_back({g.substr(0, colon), g.substr(colon + 1)});
    }
    if (!args->token_file.empty()) {
      auto token = ReadSecretFile(args->token_file);
      if (!token.ok()) {
        std::cerr << "endpoint: " << token.status().message() << "\n";
        std::exit(2);
      }
      args->options.token = *token;
    }
    args->options.connect_timeout = std::chrono::milliseconds(args->connect_timeout_ms);
    args->options.io_timeout = std::chrono::milliseconds(args->io_timeout_ms);
    args->options.punch_timeout = std::chrono::milliseconds(args->punch_timeout_ms);
    args->options.punch = !args->no_punch;
    auto e = endpoint::Endpoint::Start(args->options);
    if (!e.ok()) {
      std::cerr << "endpoint: " << e.status().ToString() << "\n";
      std::exit(1);
    }
    std::cout << "endpoint " << (*e)->uuid() << " local API on port " << (*e)->port()
              << ", peer port " << (*e)->peer_port() << ", certificate " << (*e)->fingerprint()
              << ", relay "
              << (args->options.relay.empty() ? "none"
                  : (*e)->registered()        ? "registered"
                                              : "not reached yet")
              << std::endl;
    if (!args->port_file.empty()) {
      if (FILE* f = std::fopen(args->port_file.c_str(), "w")) {
        std::fprintf(f, "%d\n", (*e)->port());
        std::fclose(f);
      }
    }
    WaitForTermination();
    std::cout << "endpoint: " << (*e)->StatusJson() << std::endl;
    (*e)->Stop();
  });

  auto* status = cmd->add_subcommand("status", "Print a running endpoint's status (JSON)");
  status->add_option("--address", args->status_address, "its local API")->capture_default_str();
  status->add_option("--token-file", args->token_file, "the local API's token, if it has one");
  status->callback([args] {
    std::string token;
    if (!args->token_file.empty()) {
      auto read = ReadSecretFile(args->token_file);
      if (!read.ok()) {
        std::cerr << "endpoint status: " << read.status().message() << "\n";
        std::exit(2);
      }
      token = *read;
    }
    auto hp = net::ParseHostPort(args->status_address);
    auto r = hp.ok()
                 ? net::HttpCall(*hp, "GET", "/status", nullptr, std::chrono::seconds(10), token)
                 : Result<net::HttpReply>(hp.status());
    if (!r.ok() || r->status != 200) {
      std::cerr << "endpoint status: "
                << (r.ok() ? net::StatusOfReply(*r, "status").ToString() : r.status().ToString())
                << "\n";
      std::exit(1);
    }
    std::cout << r->body.view() << std::endl;
  });
}

}  // namespace xsilo::cli
