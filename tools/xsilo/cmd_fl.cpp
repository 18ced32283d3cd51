// `xsilo fl`: federated averaging with the built-in MLP trainer.
//
//   xsilo fl run     a server and N clients in this process, over any transport
//   xsilo fl server  the server of a multi-host job, from a TOML job file
//   xsilo fl client  one client of a multi-host job, from the same file
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <thread>

#include "commands.h"
#include "fl_job_metrics.h"
#include "fl_report.h"
#include "xsilo/core/buffer.h"
#include "xsilo/core/secret.h"
#include "xsilo/core/tiers.h"
#include "xsilo/fl/config.h"
#include "xsilo/fl/fedavg.h"
#include "xsilo/fl/mlp.h"
#include "xsilo/metrics/endpoint.h"
#include "xsilo/metrics/metered_transport.h"
#include "xsilo/transport/compression.h"
#include "xsilo/transport/registry.h"

namespace xsilo::cli {

namespace {

using namespace xsilo::fl;

struct FlRunArgs {
  std::string transport = "inproc";
  std::string address;
  std::vector<std::string> backend;  // key=value
  std::string tier = "small";
  int clients = 7;
  int rounds = 3;
  uint64_t local_steps = 10;
  uint64_t local_epochs = 0;
  uint32_t clients_per_round = 0;
  std::string quorum = "0.5";
  double round_deadline_s = 600;
  uint64_t batch_size = 32;
  double learning_rate = 0.05;
  uint64_t seed = 1;
  double alpha = 1.0;
  double beta = 1.0;
  std::string json_path;
  bool quiet = false;
  // An external S3 service for a hybrid '<transport>+s3' (instead of the
  // embedded object server): only the server holds its credentials.
  std::string store_url;
  std::string store_bucket = "xsilo-fl";
  std::string store_region;
  std::string store_access_key;  // "" = AWS_ACCESS_KEY_ID, then ~/.aws/credentials
  std::string store_secret_key;
  std::string store_secret_key_file;
  MetricsArgs metrics;
};

struct FlFileArgs {
  std::string config;
  int rank = -1;
  std::string json_path;
  bool quiet = false;
  MetricsArgs metrics;
};

int Fail(const std::string& what, const Status& s) {
  std::cerr << "xsilo fl " << what << ": " << s.ToString() << "\n";
  return 1;
}

// A loopback TCP port that was free a moment ago.
int FreePort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  ::close(fd);
  return port;
}

Result<std::unique_ptr<Trainer>> MakeClientTrainer(const JobConfig& job, const MlpShape& shape,
                                                   int32_t rank) {
  XSILO_ASSIGN_OR_RETURN(SyntheticShard shard,
                         GenerateSyntheticShard(job.data, static_cast<uint32_t>(rank - 1)));
  MlpOptions m = job.mlp;
  m.shape = shape;
  m.seed = job.mlp.seed + static_cast<uint64_t>(rank);  // distinct batch orders
  return MakeMlpTrainer(m, std::move(shard));
}

// --store-url and its companions as the server's backend options: the
// hybrid's s3 connector on that endpoint with the given (or the default
// chain's) credentials, and upload grants, so that the clients, which get
// none of these, fetch by presigned GET and upload by presigned part URLs.
Result<std::map<std::string, std::string>> ExternalStoreOptions(const FlRunArgs& a) {
  std::map<std::string, std::string> out;
  if (a.store_url.empty()) return out;
  const std::string& t = a.transport;
  if (t.size() < 3 || t.compare(t.size() - 3, 3, "+s3") != 0) {
    return InvalidArgument("--store-url needs a '<transport>+s3' transport, not '" + t + "'");
  }
  if (a.store_url.rfind("http://", 0) != 0 && a.store_url.rfind("https://", 0) != 0) {
    return InvalidArgument("--store-url must be an http:// or https:// URL, not '" + a.store_url +
                           "'");
  }
  for (const auto& kv : a.backend) {
    if (kv.rfind("store.endpoint=", 0) == 0 || kv.rfind("store.embedded=", 0) == 0) {
      return InvalidArgument("--store-url and --backend " + kv.substr(0, kv.find('=')) +
                             " both say where the store is");
    }
  }
  std::string ak = a.store_access_key, sk = a.store_secret_key;
  if (!a.store_secret_key_file.empty()) {
    if (!sk.empty()) {
      return InvalidArgument("--store-secret-key and --store-secret-key-file are exclusive");
    }
    XSILO_ASSIGN_OR_RETURN(sk, ReadSecretFile(a.store_secret_key_file));
  }
  if (ak.empty() != sk.empty()) {
    return InvalidArgument("--store-access-key and --store-secret-key go together");
  }
  out["store.endpoint"] = a.store_url;
  out["store.bucket"] = a.store_bucket;
  if (!a.store_region.empty()) out["store.region"] = a.store_region;
  if (!ak.empty()) {
    out["store.access_key"] = ak;
    out["store.secret_key"] = sk;
  }
  out["grants"] = "1";
  return out;
}

int RunInProcess(const FlRunArgs& a) {
  JobConfig job;
  job.transport = a.transport;
  job.tier = a.tier;
  job.server.rounds = static_cast<uint64_t>(a.rounds);
  job.server.local_work = {a.local_epochs, a.local_steps};
  if (job.server.local_work.steps == 0 && job.server.local_work.epochs == 0) {
    return Fail("run", InvalidArgument("--local-steps or --local-epochs must be > 0"));
  }
  job.server.clients_per_round = a.clients_per_round;
  if (Status s = ParseQuorum(a.quorum, job.server); !s.ok()) return Fail("run", s);
  if (!(a.round_deadline_s > 0))
    return Fail("run", InvalidArgument("--round-deadline must be > 0"));
  job.server.round_deadline =
      Duration(static_cast<int64_t>(std::llround(a.round_deadline_s * 1000)));
  job.server.finish_deadline = job.server.round_deadline;
  job.server.seed = a.seed;
  job.server.show_progress = !a.quiet;
  job.mlp.batch_size = a.batch_size;
  job.mlp.learning_rate = a.learning_rate;
  job.mlp.seed = a.seed;
  job.data.seed = a.seed;
  job.data.alpha = a.alpha;
  job.data.beta = a.beta;
  job.client.default_work = job.server.local_work;

  auto shape = MlpShapeForTier(a.tier);
  if (!shape.ok()) return Fail("run", shape.status());
  const int world = a.clients + 1;
  std::string address = a.address;
  if (address.empty()) {
    address = a.transport == "inproc" ? "xsilo-fl-run" : "127.0.0.1:" + std::to_string(FreePort());
  }
  auto external = ExternalStoreOptions(a);
  if (!external.ok()) return Fail("run", external.status());
  auto metrics = JobMetrics::Start(a.metrics);
  if (!metrics.ok()) return Fail("run", metrics.status());
  std::vector<std::unique_ptr<Transport>> parties;
  for (int r = 0; r < world; ++r) {
    TransportOptions o;
    o.rank = r;
    o.world_size = world;
    o.address = address;
    if (r == 0) o.backend = *external;
    for (const auto& kv : a.backend) {
      auto eq = kv.find('=');
      if (eq == std::string::npos) {
        return Fail("run", InvalidArgument("--backend wants key=value, got '" + kv + "'"));
      }
      o.backend[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
    auto t = TransportRegistry::Global().Create(a.transport, o);
    if (!t.ok()) return Fail("run", t.status());
    parties.push_back(std::move(t).value());
    if (*metrics) {
      parties.back() = (*metrics)->Meter(std::move(parties.back()),
                                         r == 0 ? "server" : "client " + std::to_string(r));
    }
  }

  std::printf(
      "xsilo fl run: 1 server + %d clients over '%s'; %s tier: MLP %s, %llu float32 "
      "parameters (%s); %d rounds of %llu local %s; quorum %s, round deadline %.0f s\n",
      a.clients, a.transport.c_str(), a.tier.c_str(), shape->ToString().c_str(),
      static_cast<unsigned long long>(shape->ParameterCount()),
      Mb(shape->ParameterCount() * 4).c_str(), a.rounds,
      static_cast<unsigned long long>(job.server.local_work.steps ? job.server.local_work.steps
                                                                  : job.server.local_work.epochs),
      job.server.local_work.steps ? "steps" : "epochs", a.quorum.c_str(), a.round_deadline_s);
  std::fflush(stdout);

  // Data and trainers first, so that the rounds time training, not set-up.
  std::vector<std::unique_ptr<Trainer>> trainers;
  for (int r = 1; r < world; ++r) {
    auto t = MakeClientTrainer(job, *shape, r);
    if (!t.ok()) return Fail("run", t.status());
    trainers.push_back(std::move(t).value());
  }
  auto initial = MlpInitialParameters(*shape, job.mlp.seed);
  if (!initial.ok()) return Fail("run", initial.status());

  std::vector<std::future<Status>> starts;
  for (auto& p : parties)
    starts.push_back(std::async(std::launch::async, [&p] { return p->Start(); }));
  Status start_status;
  for (auto& f : starts) {
    Status s = f.get();
    if (!s.ok() && start_status.ok()) start_status = s;
  }
  if (!start_status.ok()) {
    for (auto& p : parties) p->Stop();
    return Fail("run (starting the transports)", start_status);
  }

  std::vector<std::future<Result<ClientReport>>> clients;
  for (int r = 1; r < world; ++r) {
    clients.push_back(std::async(std::launch::async, [&, r]() -> Result<ClientReport> {
      FedAvgClient c(*parties[r], *trainers[r - 1], job.client);
      return c.Run();
    }));
  }
  PrintRoundHeader();
  job.server.on_round = [&](const RoundReport& r) {
    if (*metrics) (*metrics)->OnRound(r);
    PrintRound(r, job.server.rounds);
  };
  FedAvgServer server(*parties[0], job.server);
  if (*metrics) {
    (*metrics)->JobStarted(job.server.rounds, TotalBytes(*initial));
    (*metrics)->Watch(&server.timers());
  }
  auto report = server.Run(std::move(initial).value());
  int rc = 0;
  if (!report.ok()) {
    rc = Fail("run", report.status());
    parties[0]->Stop();  // releases clients still waiting
  }
  std::vector<PartyTimes> times = {{"server", 0, server.timers().Snapshot()}};
  for (int r = 1; r < world; ++r) {
    auto c = clients[r - 1].get();
    if (!c.ok()) {
      if (rc == 0) rc = Fail("run (client " + std::to_string(r) + ")", c.status());
      continue;
    }
    times.push_back({"client " + std::to_string(r), r, c->seconds});
  }
  // Clients first: a server that left first would make them reconnect.
  for (auto it = parties.rbegin(); it != parties.rend(); ++it) (*it)->Stop();
  if (*metrics) (*metrics)->JobFinished(rc == 0, times);
  if (!report.ok()) {
    if (*metrics) (*metrics)->Linger();
    return rc;
  }

  PrintFinal(report->final_evaluation, a.clients);
  std::printf("\nper-state time (s), as in Figure 5:\n%s", FormatStateTable(times).c_str());
  if (report->late_updates_discarded > 0) {
    std::printf("late updates discarded: %llu\n",
                static_cast<unsigned long long>(report->late_updates_discarded));
  }
  if (!a.json_path.empty()) {
    Status s = WriteJson(a.json_path, JobJson(a.transport, a.tier, *shape, *report, times));
    if (!s.ok()) return Fail("run", s);
    std::printf("report: %s\n", a.json_path.c_str());
  }
  std::fflush(stdout);
  if (*metrics) (*metrics)->Linger();
  return rc;
}

Result<JobConfig> LoadJob(const FlFileArgs& a) {
  XSILO_ASSIGN_OR_RETURN(Config c, Config::Load(a.config));
  return ReadJobConfig(c);
}

int RunServer(const FlFileArgs& a) {
  auto job = LoadJob(a);
  if (!job.ok()) return Fail("server", job.status());
  job->transport_options.rank = 0;
  auto shape = MlpShapeForTier(job->tier);
  if (!shape.ok()) return Fail("server", shape.status());
  auto initial = MlpInitialParameters(*shape, job->mlp.seed);
  if (!initial.ok()) return Fail("server", initial.status());
  auto t = TransportRegistry::Global().Create(job->transport, job->transport_options);
  if (!t.ok()) return Fail("server", t.status());
  auto metrics = JobMetrics::Start(a.metrics);
  if (!metrics.ok()) return Fail("server", metrics.status());
  const Transport* unmetered = t->get();  // the compressing decorator, if any
  if (*metrics) *t = (*metrics)->Meter(std::move(*t), "server");
  std::printf("xsilo fl server: '%s' at %s, waiting for %d clients; %s tier (%s, %s)\n",
              job->transport.c_str(), job->transport_options.address.c_str(),
              job->transport_options.world_size - 1, job->tier.c_str(), shape->ToString().c_str(),
              Mb(shape->ParameterCount() * 4).c_str());
  std::fflush(stdout);
  if (Status s = (*t)->Start(); !s.ok()) return Fail("server", s);
  job->server.show_progress = !a.quiet;
  job->server.on_round = [&](const RoundReport& r) {
    if (*metrics) (*metrics)->OnRound(r);
    PrintRound(r, job->server.rounds);
  };
  PrintRoundHeader();
  FedAvgServer server(**t, job->server);
  if (*metrics) {
    (*metrics)->JobStarted(job->server.rounds, TotalBytes(*initial));
    (*metrics)->Watch(&server.timers());
  }
  auto report = server.Run(std::move(initial).value());
  (*t)->Stop();
  if (*metrics) {
    (*metrics)->JobFinished(
        report.ok(), report.ok()
                         ? report->times
                         : std::vector<PartyTimes>{{"server", 0, server.timers().Snapshot()}});
  }
  if (!report.ok()) {
    int rc = Fail("server", report.status());
    if (*metrics) (*metrics)->Linger();
    return rc;
  }
  PrintFinal(report->final_evaluation, job->transport_options.world_size - 1);
  std::printf("\nper-state time (s), clients as last reported:\n%s",
              FormatStateTable(report->times).c_str());
  const nlohmann::json compression = ReportCompression(*unmetered, "server");
  if (!a.json_path.empty()) {
    nlohmann::json j = JobJson(job->transport, job->tier, *shape, *report, report->times);
    if (!compression.is_null()) j["compression"] = compression;
    Status s = WriteJson(a.json_path, j);
    if (!s.ok()) return Fail("server", s);
  }
  std::fflush(stdout);
  if (*metrics) (*metrics)->Linger();
  return 0;
}

int RunClient(const FlFileArgs& a) {
  auto job = LoadJob(a);
  if (!job.ok()) return Fail("client", job.status());
  if (a.rank >= 0) job->transport_options.rank = a.rank;
  const int32_t rank = job->transport_options.rank;
  if (rank <= 0 || rank >= job->transport_options.world_size) {
    return Fail("client", InvalidArgument("a client needs a rank in 1.." +
                                          std::to_string(job->transport_options.world_size - 1) +
                                          " (--rank or [transport] rank)"));
  }
  auto shape = MlpShapeForTier(job->tier);
  if (!shape.ok()) return Fail("client", shape.status());
  auto trainer = MakeClientTrainer(*job, *shape, rank);
  if (!trainer.ok()) return Fail("client", trainer.status());
  auto t = TransportRegistry::Global().Create(job->transport, job->transport_options);
  if (!t.ok()) return Fail("client", t.status());
  // MakeClientTrainer succeeded, so the instruction set is known.
  std::printf("xsilo fl client %d: '%s' to %s; %s tier (%s; MLP products: %s)\n", rank,
              job->transport.c_str(), job->transport_options.address.c_str(), job->tier.c_str(),
              shape->ToString().c_str(), fl::MlpInstructionSet().value_or("?").c_str());
  std::fflush(stdout);
  if (Status s = (*t)->Start(); !s.ok()) return Fail("client", s);
  job->client.show_progress = !a.quiet;
  FedAvgClient client(**t, **trainer, job->client);
  auto report = client.Run();
  (*t)->Stop();
  if (!report.ok()) return Fail("client", report.status());
  std::printf(
      "trained %llu rounds (%llu stale models skipped); final model: loss %.4f, accuracy "
      "%.4f on %llu held-out samples\n",
      static_cast<unsigned long long>(report->rounds_trained),
      static_cast<unsigned long long>(report->stale_models_skipped), report->final_evaluation.loss,
      report->final_evaluation.accuracy,
      static_cast<unsigned long long>(report->final_evaluation.samples));
  std::vector<PartyTimes> times = {{"client " + std::to_string(rank), rank, report->seconds}};
  std::printf("\nper-state time (s):\n%s", FormatStateTable(times).c_str());
  const nlohmann::json compression = ReportCompression(**t, "client " + std::to_string(rank));
  if (!a.json_path.empty()) {
    nlohmann::json j = nlohmann::json::parse(StateTableJson(times));
    if (!compression.is_null()) j["compression"] = compression;
    Status s = WriteJson(a.json_path, j);
    if (!s.ok()) return Fail("client", s);
  }
  return 0;
}

// --buffer-cache-bytes, on every fl command: the process's idle cache of
// large Buffers (Buffer::ConfigureIdleCache), off in the library by
// default and on here, where every round frees and allocates the same
// sizes. Without the option XSILO_BUFFER_CACHE_BYTES, when set, decides.
// XSILO_BUFFER_CACHE_SECONDS sets the age either way.
struct BufferCacheArg {
  uint64_t bytes = 1ull << 30;
  CLI::Option* option = nullptr;
};

void AddBufferCacheOption(CLI::App* cmd, BufferCacheArg* a) {
  a->option = cmd->add_option("--buffer-cache-bytes", a->bytes,
                              "idle large buffers kept for reuse for up to 60 s, in bytes "
                              "(0: none; docs/fl.md)")
                  ->capture_default_str();
}

void ApplyBufferCache(const BufferCacheArg& a) {
  if (a.option->count() == 0 && std::getenv("XSILO_BUFFER_CACHE_BYTES") != nullptr) return;
  Buffer::ConfigureIdleCache(a.bytes, Buffer::IdleCacheMaxAge());
}

}  // namespace

void AddFlCommand(CLI::App& app) {
  auto* fl = app.add_subcommand("fl", "Federated averaging with the built-in MLP trainer");
  fl->require_subcommand(1);

  static FlRunArgs run;
  auto* r = fl->add_subcommand("run", "A server and N clients in this process over --transport");
  r->add_option("--transport", run.transport, "registered transport name")->capture_default_str();
  r->add_option(
      "--address", run.address,
      "server address (default: a fabric name for inproc, a free loopback port otherwise)");
  r->add_option("--backend", run.backend, "backend option key=value (repeatable)");
  r->add_option("--tier", run.tier, "model tier: small, medium, big, large")->capture_default_str();
  r->add_option("--clients", run.clients, "number of clients")
      ->capture_default_str()
      ->check(CLI::Range(1, 1024));
  r->add_option("--rounds", run.rounds, "rounds")
      ->capture_default_str()
      ->check(CLI::Range(1, 1000000));
  static CLI::Option* steps =
      r->add_option("--local-steps", run.local_steps, "SGD steps per client per round")
          ->capture_default_str();
  r->add_option("--local-epochs", run.local_epochs,
                "local epochs per round instead of steps (unless --local-steps is also given)");
  r->add_option("--clients-per-round", run.clients_per_round,
                "clients selected per round (0 = all)")
      ->capture_default_str();
  r->add_option(
       "--quorum", run.quorum,
       "updates a round needs: a fraction of the selected clients (0.5, 50%) or a count (5)")
      ->capture_default_str();
  r->add_option("--round-deadline", run.round_deadline_s, "seconds a round waits for updates")
      ->capture_default_str();
  r->add_option("--batch-size", run.batch_size, "SGD mini-batch size")->capture_default_str();
  r->add_option("--learning-rate", run.learning_rate, "SGD step size")->capture_default_str();
  r->add_option("--seed", run.seed, "seeds data, model and selection")->capture_default_str();
  r->add_option("--alpha", run.alpha, "Synthetic(alpha, beta): model heterogeneity")
      ->capture_default_str();
  r->add_option("--beta", run.beta, "Synthetic(alpha, beta): feature heterogeneity")
      ->capture_default_str();
  r->add_option("--json", run.json_path, "write the rounds and the per-state table as JSON here");
  r->add_flag("--quiet", run.quiet, "no progress line on stderr");
  AddMetricsOptions(r, run.metrics);
  r->add_option("--store-url", run.store_url,
                "external S3 endpoint (AWS S3, MinIO, Ceph RGW) for a '<transport>+s3' "
                "transport instead of the embedded object server; only the server holds its "
                "credentials, clients use presigned URLs");
  r->add_option("--store-bucket", run.store_bucket, "bucket on --store-url (created if missing)")
      ->capture_default_str();
  r->add_option("--store-region", run.store_region, "region of --store-url (default us-east-1)");
  r->add_option("--store-access-key", run.store_access_key,
                "access key for --store-url (default: AWS_ACCESS_KEY_ID, then ~/.aws/credentials)");
  r->add_option("--store-secret-key", run.store_secret_key,
                "secret key for --store-url (default: AWS_SECRET_ACCESS_KEY, then "
                "~/.aws/credentials; visible to `ps`: prefer --store-secret-key-file)");
  r->add_option("--store-secret-key-file", run.store_secret_key_file,
                "read the secret key for --store-url from this file (mode 600)");
  static BufferCacheArg run_cache;
  AddBufferCacheOption(r, &run_cache);
  r->callback([] {
    ApplyBufferCache(run_cache);
    // Epochs alone replace the default steps.
    if (run.local_epochs > 0 && steps->count() == 0) run.local_steps = 0;
    int rc = RunInProcess(run);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });

  static FlFileArgs server;
  auto* s = fl->add_subcommand("server", "The server of a multi-host job (rank 0)");
  s->add_option("--config", server.config, "TOML job file (see docs/fl.md)")->required();
  s->add_option("--json", server.json_path,
                "write the rounds and the per-state table as JSON here");
  s->add_flag("--quiet", server.quiet, "no progress line on stderr");
  AddMetricsOptions(s, server.metrics);
  static BufferCacheArg server_cache;
  AddBufferCacheOption(s, &server_cache);
  s->callback([] {
    ApplyBufferCache(server_cache);
    int rc = RunServer(server);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });

  static FlFileArgs client;
  auto* c = fl->add_subcommand("client", "One client of a multi-host job");
  c->add_option("--config", client.config, "TOML job file (see docs/fl.md)")->required();
  c->add_option("--rank", client.rank, "this client's rank (1..world_size-1); overrides the file");
  c->add_option("--json", client.json_path, "write this client's per-state times as JSON here");
  c->add_flag("--quiet", client.quiet, "no progress line on stderr");
  static BufferCacheArg client_cache;
  AddBufferCacheOption(c, &client_cache);
  c->callback([] {
    ApplyBufferCache(client_cache);
    int rc = RunClient(client);
    if (rc != 0) throw CLI::RuntimeError(rc);
  });
}

}  // namespace xsilo::cli
