// connector_throughput: put, get and remote-set throughput of a connector
// between two processes on loopback, beside iperf3's single-stream figure
// for the same loopback (the floor: one TCP stream with nothing on top).
// Prints a table and writes JSON.
//
//   connector_throughput [--connectors zmq[,ucx,...]] [--sizes 100MB,1GB]
//                        [--repeats 3] [--iperf-seconds 3] [--no-iperf]
//                        [--option name=value ...] [--json PATH]
//
// Per connector, size and repeat:
//   put  this process puts the object (timed) and keeps the connector;
//   get  a child process rebuilds the connector from config() and gets the
//        key (timed: the Get call only), then checks the XXH3-64 checksum;
//   set  this process makes a deferred key (NewKey), a child fills it with
//        Set (timed), this process gets it back and checks the checksum.
// For zmq, put stores into this process's memory (no network), get pulls
// the bytes from this process's server, set pushes them to it.
// A connector is named by its registered type and built with its default
// options plus --option values; an unknown type is an error.
#include <fcntl.h>
#include <netinet/in.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/core/codec.h"
#include "xsilo/store/connector.h"

extern char** environ;

using namespace xsilo;
using Clock = std::chrono::steady_clock;

namespace {

constexpr const char* kChildEnv = "XSILO_CONNECTOR_THROUGHPUT_CHILD";

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Bytes that differ from object to object and cost little to make.
Result<Buffer> Pattern(uint64_t size, uint64_t seed) {
  XSILO_ASSIGN_OR_RETURN(Buffer b, Buffer::Allocate(size));
  uint8_t* p = b.mutable_data();
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  uint64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < size; ++i) p[i] = static_cast<uint8_t>(i);
  return b;
}

// The child: "get" or "set" one key through a connector rebuilt from its
// config; prints the seconds the call took, or "error ..." and exits 1.
int RunChild(const char* spec) {
  std::istringstream in(spec);
  std::string mode, config_json, key_json, checksum_text, size_text, seed_text;
  std::getline(in, mode);
  std::getline(in, config_json);
  std::getline(in, key_json);
  std::getline(in, checksum_text);
  std::getline(in, size_text);
  std::getline(in, seed_text);
  auto fail = [](const std::string& what) {
    std::printf("error %s\n", what.c_str());
    return 1;
  };
  auto config = ConnectorConfig::FromJson(config_json);
  auto key = Key::FromJson(key_json);
  if (!config.ok() || !key.ok()) return fail("bad child spec");
  auto c = MakeConnector(*config);
  if (!c.ok()) return fail(c.status().ToString());
  if (mode == "get") {
    auto t0 = Clock::now();
    auto got = (*c)->Get(*key);
    auto t1 = Clock::now();
    if (!got.ok()) return fail(got.status().ToString());
    if (!got->has_value()) return fail("key not found");
    if (Checksum((*got)->span()) != std::stoull(checksum_text)) return fail("checksum mismatch");
    std::printf("%.9f\n", Seconds(t0, t1));
    return 0;
  }
  auto data = Pattern(std::stoull(size_text), std::stoull(seed_text));
  if (!data.ok()) return fail(data.status().ToString());
  GatherList g;
  g.Append(*data);
  auto t0 = Clock::now();
  Status st = (*c)->Set(*key, g);
  auto t1 = Clock::now();
  if (!st.ok()) return fail(st.ToString());
  std::printf("%.9f\n", Seconds(t0, t1));
  (*c)->Close();
  return 0;
}

// Runs this program as a child with `spec`; its printed seconds.
Result<double> InChild(const std::string& spec) {
  int out[2];
  if (pipe(out) != 0) return Internal("pipe failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, out[1], 1);
  posix_spawn_file_actions_addclose(&actions, out[0]);
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  env.push_back(std::string(kChildEnv) + "=" + spec);
  std::vector<char*> envp;
  for (auto& s : env) envp.push_back(s.data());
  envp.push_back(nullptr);
  std::string exe = "/proc/self/exe";
  char* argv[] = {exe.data(), nullptr};
  pid_t pid;
  int rc = posix_spawn(&pid, exe.c_str(), &actions, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&actions);
  close(out[1]);
  if (rc != 0) {
    close(out[0]);
    return Internal("cannot spawn the child process");
  }
  std::string text;
  char buf[512];
  ssize_t n;
  while ((n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  close(out[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || text.rfind("error", 0) == 0) {
    return Internal("child failed: " + text);
  }
  return std::stod(text);
}

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  int port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

// iperf3's single-stream loopback throughput in MB/s (received side), or
// a negative number when iperf3 cannot be run.
double IperfMBps(int seconds, std::string* error) {
  int port = FreePort();
  std::string p = std::to_string(port);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 2, "/dev/null", O_WRONLY, 0);
  std::string prog = "iperf3", s = "-s", once = "-1", dash_p = "-p";
  char* argv[] = {prog.data(), s.data(), once.data(), dash_p.data(), p.data(), nullptr};
  pid_t server;
  int rc = posix_spawnp(&server, "iperf3", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    *error = "cannot run iperf3 (scripts/install-deps.sh installs it)";
    return -1;
  }
  double mbps = -1;
  std::string command = "iperf3 -c 127.0.0.1 -p " + p + " -J -t " + std::to_string(seconds);
  for (int attempt = 0; attempt < 50 && mbps < 0; ++attempt) {
    if (attempt > 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    FILE* f = popen((command + " 2>/dev/null").c_str(), "r");
    if (!f) break;
    std::string text;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    pclose(f);
    auto j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded() || j.contains("error")) {
      *error = j.is_discarded() ? "iperf3 printed no JSON" : j["error"].get<std::string>();
      continue;
    }
    mbps = j["end"]["sum_received"]["bits_per_second"].get<double>() / 8e6;
  }
  if (mbps < 0) kill(server, SIGTERM);
  waitpid(server, nullptr, 0);
  return mbps;
}

struct Stats {
  double min = 0, median = 0, max = 0;
  std::vector<double> samples;
};

Stats Summarize(std::vector<double> v) {
  Stats s;
  s.samples = v;
  std::sort(v.begin(), v.end());
  s.min = v.front();
  s.median = v[v.size() / 2];
  s.max = v.back();
  return s;
}

std::string StatsJson(const Stats& s) {
  std::ostringstream o;
  o.precision(6);
  o << "{\"median\": " << s.median << ", \"min\": " << s.min << ", \"max\": " << s.max
    << ", \"samples\": [";
  for (size_t i = 0; i < s.samples.size(); ++i) o << (i ? ", " : "") << s.samples[i];
  o << "]}";
  return o.str();
}

Result<uint64_t> ParseSize(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    return InvalidArgument("bad size '" + text + "'");
  }
  std::string unit = text.substr(used);
  static const std::map<std::string, double> units = {
      {"", 1},     {"B", 1},        {"KB", 1e3},        {"MB", 1e6},
      {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  auto it = units.find(unit);
  if (it == units.end() || v < 0) return InvalidArgument("bad size '" + text + "'");
  return static_cast<uint64_t>(v * it->second);
}

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

struct Row {
  std::string connector;
  uint64_t bytes;
  Stats put, get, set;
};

// put / get / set throughput of one connector and size, in MB/s per repeat.
Status Measure(const ConnectorConfig& base, uint64_t bytes, int repeats, Row* row) {
  XSILO_ASSIGN_OR_RETURN(std::unique_ptr<Connector> c, MakeConnector(base));
  std::vector<double> put, get, set;
  for (int r = 0; r < repeats; ++r) {
    uint64_t seed = 1000 + static_cast<uint64_t>(r);
    Key key;
    uint64_t checksum;
    {
      XSILO_ASSIGN_OR_RETURN(Buffer data, Pattern(bytes, seed));
      checksum = Checksum(data.span());
      auto t0 = Clock::now();
      XSILO_ASSIGN_OR_RETURN(key, c->Put(data));
      put.push_back(bytes / 1e6 / Seconds(t0, Clock::now()));
    }
    std::string config = c->config().ToJson();
    XSILO_ASSIGN_OR_RETURN(double get_s, InChild("get\n" + config + "\n" + key.ToJson() + "\n" +
                                                 std::to_string(checksum) + "\n0\n0"));
    get.push_back(bytes / 1e6 / get_s);
    XSILO_RETURN_IF_ERROR(c->Evict(key));

    XSILO_ASSIGN_OR_RETURN(Key deferred, c->NewKey());
    XSILO_ASSIGN_OR_RETURN(double set_s,
                           InChild("set\n" + config + "\n" + deferred.ToJson() + "\n0\n" +
                                   std::to_string(bytes) + "\n" + std::to_string(seed)));
    set.push_back(bytes / 1e6 / set_s);
    {
      XSILO_ASSIGN_OR_RETURN(auto back, c->Get(deferred));
      if (!back.has_value() || back->size() != bytes || Checksum(back->span()) != checksum) {
        return Corrupt("the object the child set does not read back");
      }
    }
    XSILO_RETURN_IF_ERROR(c->Evict(deferred));
  }
  row->put = Summarize(put);
  row->get = Summarize(get);
  row->set = Summarize(set);
  c->Close();
  return Status::OK();
}

// The glibc malloc tunables set in the environment (both processes see
// them), as a JSON object: they change the receiving side's page faults.
std::string MallocEnvironment() {
  nlohmann::json env = nlohmann::json::object();
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    if (kv.rfind("MALLOC_", 0) == 0 || kv.rfind("GLIBC_TUNABLES=", 0) == 0) {
      auto eq = kv.find('=');
      env[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  return env.dump();
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* spec = std::getenv(kChildEnv)) return RunChild(spec);

  std::string connectors = "zmq", sizes = "100MB,1GB", json_path = "connector_throughput.json";
  int repeats = 3, iperf_seconds = 3;
  bool iperf = true;
  std::map<std::string, std::string> extra;
  std::string command_line = "connector_throughput";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    command_line += " " + a;
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::cerr << "connector_throughput: " << a << " needs a value\n";
        std::exit(2);
      }
      command_line += std::string(" ") + argv[i + 1];
      return argv[++i];
    };
    if (a == "--connectors") {
      connectors = next();
    } else if (a == "--sizes") {
      sizes = next();
    } else if (a == "--repeats") {
      repeats = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--iperf-seconds") {
      iperf_seconds = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--no-iperf") {
      iperf = false;
    } else if (a == "--option") {
      std::string kv = next();
      auto eq = kv.find('=');
      if (eq == std::string::npos) {
        std::cerr << "connector_throughput: --option wants name=value\n";
        return 2;
      }
      extra[kv.substr(0, eq)] = kv.substr(eq + 1);
    } else if (a == "--json") {
      json_path = next();
    } else {
      std::cerr << "usage: connector_throughput [--connectors zmq,...] [--sizes 100MB,1GB] "
                   "[--repeats 3] [--iperf-seconds 3] [--no-iperf] [--option name=value] "
                   "[--json PATH]\n";
      return 2;
    }
  }

  std::vector<std::string> names = Split(connectors);
  std::vector<std::string> known = ConnectorTypes();
  for (const std::string& name : names) {
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
      std::cerr << "connector_throughput: no connector type '" << name
                << "' in this build (available: " << list << ")\n";
      return 2;
    }
  }
  std::vector<uint64_t> byte_sizes;
  for (const std::string& s : Split(sizes)) {
    auto b = ParseSize(s);
    if (!b.ok()) {
      std::cerr << "connector_throughput: " << b.status().ToString() << "\n";
      return 2;
    }
    byte_sizes.push_back(*b);
  }

  double floor_mbps = -1;
  std::string iperf_error;
  if (iperf) {
    floor_mbps = IperfMBps(iperf_seconds, &iperf_error);
    if (floor_mbps < 0) std::cerr << "connector_throughput: iperf3: " << iperf_error << "\n";
  }

  std::vector<Row> rows;
  for (const std::string& name : names) {
    for (uint64_t bytes : byte_sizes) {
      Row row{name, bytes, {}, {}, {}};
      Status st = Measure({name, extra}, bytes, repeats, &row);
      if (!st.ok()) {
        std::cerr << "connector_throughput: " << name << ", " << bytes
                  << " bytes: " << st.ToString() << "\n";
        return 1;
      }
      rows.push_back(row);
    }
  }

  std::printf("two processes on loopback, %d repeats, MB/s = 1e6 bytes/s, median [min-max]\n",
              repeats);
  std::printf("%-10s %14s %26s %26s %26s %12s\n", "connector", "bytes", "put", "get (other proc)",
              "set (other proc)", "iperf3 1x");
  auto cell = [](const Stats& s) {
    char b[64];
    std::snprintf(b, sizeof b, "%.0f [%.0f-%.0f]", s.median, s.min, s.max);
    return std::string(b);
  };
  for (const Row& r : rows) {
    std::printf("%-10s %14llu %26s %26s %26s %12.0f\n", r.connector.c_str(),
                static_cast<unsigned long long>(r.bytes), cell(r.put).c_str(), cell(r.get).c_str(),
                cell(r.set).c_str(), floor_mbps);
  }

  std::ostringstream json;
  json << "{\n  \"benchmark\": \"connector_throughput\",\n  \"command\": "
       << nlohmann::json(command_line).dump()
       << ",\n  \"malloc_environment\": " << MallocEnvironment() << ",\n  \"repeats\": " << repeats
       << ",\n  \"iperf3_single_stream_MBps\": ";
  if (floor_mbps >= 0) {
    json << floor_mbps;
  } else {
    json << "null";
  }
  json << ",\n  \"iperf3_seconds\": " << iperf_seconds << ",\n  \"results\": [";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    json << (i ? "," : "") << "\n    {\"connector\": \"" << r.connector
         << "\", \"bytes\": " << r.bytes << ", \"put_MBps\": " << StatsJson(r.put)
         << ", \"get_MBps\": " << StatsJson(r.get) << ", \"set_MBps\": " << StatsJson(r.set) << "}";
  }
  json << "\n  ]\n}\n";
  std::ofstream(json_path) << json.str();
  std::printf("JSON written to %s\n", json_path.c_str());
  return 0;
}
