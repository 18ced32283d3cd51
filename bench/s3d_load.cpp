// s3d_load: wrk against a running `xsilo s3d`, many connections for a fixed
// time on GET of 1 MiB objects, then on PUT of them; the server's memory
// and descriptors before and after each phase, latency percentiles.
//
//   s3d_load [--xsilo PATH] [--wrk wrk] [--connections 256] [--seconds 60]
//            [--warmup-seconds 5] [--threads 2] [--objects 64]
//            [--object-bytes 1048576] [--memory | --dir-root DIR]
//            [--max-connections N] [--timeout-seconds 30] [--settle-seconds 30]
//            [--max-rss-growth-mb 16] [--keep] [--json s3d_load.json]
//
// The program starts `xsilo s3d` as its child (--xsilo, default the xsilo
// of the same build tree: <build>/tools/xsilo/xsilo), on
// 127.0.0.1, an ephemeral port (--port 0 --port-file), one bucket, objects
// in a fresh directory under --dir-root (default the system's temporary
// directory) or in memory (--memory), the secret key in a 0600 file
// (--secret-key-file, never on a command line), --max-connections N
// worker threads (default: --connections, so that every connection has a
// worker; 0 keeps s3d's own default). It raises its soft descriptor limit
// (RLIMIT_NOFILE, inherited by s3d and wrk) to what the connections need,
// when the hard limit allows.
//
// With the xsilo S3 client it creates --objects objects of --object-bytes
// bytes (deterministic pseudo-random content), presigns a GET URL for each
// (carrying response-content-disposition=<key>, so each response names its
// key) and a PUT URL for each, and closes its connections. Then, per
// phase, it writes a wrk Lua script and runs
//   wrk -t<threads> -c<connections> -d<secs>s --timeout <t>s --latency -s SCRIPT URL
// first for --warmup-seconds (the server grows its worker threads and
// heaps there), then for --seconds:
//   GET: the connections cycle through the presigned GET URLs; every 2xx
//        body is compared whole with the object its Content-Disposition
//        names (wrk's Lua, one string comparison each).
//   PUT: the connections cycle through the presigned PUT URLs, each key
//        with a 1 MiB body of its own (not its original content); each 2xx
//        response's ETag (the MD5 the server computed of what it stored)
//        must be that key's body's MD5, and counts an acknowledged PUT.
// The Lua scripts count statuses by class per wrk thread (each thread has
// its own Lua state; done() sums them with thread:get).
//
// Before a phase (after its warm-up) and after it, it samples s3d's VmRSS
// and its descriptor count (/proc/<pid>/fd), and reads VmHWM after the
// phase (reset through clear_refs before it). "After" is once wrk exited
// and s3d's descriptors came back to the count before the phase, waited
// for with a deadline (--settle-seconds), never a fixed sleep. After each
// phase the S3 client GETs every object: after GET each must be its
// original; after PUT each key with an acknowledged PUT must hold exactly
// its PUT body, and any other key its original or its PUT body (from the
// warm-up, or a PUT still in flight when wrk stopped), never anything else.
//
// wrk 4.1 has no timer for a request in flight: a connection that is
// never answered counts no error there. So the program also polls s3d's
// descriptors (and its listening socket's accept queue) while wrk runs,
// and every one of the connections must have been open at s3d at once.
// A response slower than --timeout-seconds is an error (wrk's timeout,
// which also keeps it out of the latency histogram, so it must lie above
// every latency; the default, 30 s, is half of s3d's 60 s io_timeout).
// The percentiles are wrk's, which it corrects for coordinated omission
// (stats_correct) before reporting them.
//
// It prints wrk's own output, a table, writes JSON (every figure, the
// parameters, the load average before and after) and exits 1 when any
// request failed (socket errors connect/read/write/timeout, a status
// outside 2xx, a body or ETag that does not match), when not every
// connection was open at s3d at once, when s3d's descriptors after a phase
// differ from before it, when its RSS after a phase exceeds
// the RSS before it by more than --max-rss-growth-mb, when an object is
// wrong afterwards, or when s3d died or did not stop cleanly on SIGTERM;
// 2 when it could not run (wrk missing, s3d would not start, bad options).
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/bench/process.h"
#include "xsilo/s3/client.h"

extern char** environ;

namespace {

using namespace xsilo;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr char kBucket[] = "load";
constexpr char kAccessKey[] = "s3d-load";

struct Args {
  std::string xsilo;  // "" = next to this program in the build tree
  std::string wrk = "wrk";
  int connections = 256;
  int seconds = 60;
  int warmup_seconds = 5;
  int threads = 2;
  int objects = 64;
  uint64_t object_bytes = 1 << 20;
  bool memory = false;
  std::string dir_root;      // "" = the system's temporary directory
  int max_connections = -1;  // s3d --max-connections; -1 = --connections, 0 = s3d's default
  int timeout_seconds = 30;  // wrk --timeout (see the top of this file)
  int settle_seconds = 30;
  // Eight times the largest drift of s3d's RSS over a phase after its
  // warm-up, and less than a leak of a few hundred bytes per request adds
  // over a full run (the figures: docs/reliability.md).
  double max_rss_growth_mb = 16;
  bool keep = false;
  std::string json = "s3d_load.json";
};

int Usage(const std::string& why) {
  std::fprintf(stderr, "s3d_load: %s\n", why.c_str());
  return 2;
}

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// ---- processes -------------------------------------------------------------

int OpenFds(pid_t pid) { return bench::OpenFds(std::to_string(pid)); }

// Connections waiting in the accept queue of `pid`'s listening TCP socket
// on `port` (/proc/<pid>/net/tcp: a LISTEN socket's rx_queue is its queue
// length); -1 when not found.
int ListenBacklog(pid_t pid, int port) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::istringstream f(line);
    std::string slot, local, remote, state, queues;
    if (!(f >> slot >> local >> remote >> state >> queues)) continue;
    const size_t colon = local.find(':'), qcolon = queues.find(':');
    if (state != "0A" || colon == std::string::npos || qcolon == std::string::npos) continue;
    if (std::stoi(local.substr(colon + 1), nullptr, 16) != port) continue;
    return static_cast<int>(std::stoul(queues.substr(qcolon + 1), nullptr, 16));
  }
  return -1;
}

struct ProcSample {
  uint64_t rss = 0, hwm = 0;
  int fds = 0;
};

ProcSample Sample(pid_t pid) {
  const std::string p = std::to_string(pid);
  return {bench::StatusBytes(p, "VmRSS"), bench::StatusBytes(p, "VmHWM"), OpenFds(pid)};
}

json SampleJson(const ProcSample& s) {
  return {{"rss_bytes", s.rss}, {"hwm_bytes", s.hwm}, {"fds", s.fds}};
}

// Starts argv[0] (searched in PATH when it has no '/') with stdin from
// /dev/null and stdout and stderr into `log`. -1 when it could not start.
pid_t Spawn(const std::vector<std::string>& argv, const std::vector<std::string>& env,
            const std::string& log) {
  std::vector<char*> av, ev;
  for (const auto& a : argv) av.push_back(const_cast<char*>(a.c_str()));
  av.push_back(nullptr);
  for (const auto& e : env) ev.push_back(const_cast<char*>(e.c_str()));
  ev.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  pid_t pid = -1;
  const int rc = posix_spawnp(&pid, av[0], &fa, nullptr, av.data(), ev.data());
  posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Waits up to `limit` for `pid` to exit; its exit code, 128 + signal, or
// -1 when it is still running.
int WaitExit(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (true) {
    int st = 0;
    const pid_t r = waitpid(pid, &st, WNOHANG);
    if (r == pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r < 0) return -1;
    if (Clock::now() >= deadline) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

// True while `pid` runs; an exited child is left for WaitExit to reap.
bool Alive(pid_t pid) {
  siginfo_t info{};
  return waitid(P_PID, pid, &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == 0;
}

// "exit N" or "signal N", as WaitExit returns it.
std::string ExitText(int code) {
  if (code < 0) return "still running";
  return code >= 128 ? "killed by signal " + std::to_string(code - 128)
                     : "exit code " + std::to_string(code);
}

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

bool WriteBytes(const std::string& path, const std::string& bytes, mode_t mode = 0644) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + off, bytes.size() - off);
    if (n <= 0) break;
    off += static_cast<size_t>(n);
  }
  return ::close(fd) == 0 && off == bytes.size();
}

// The executable `name` resolves to ("" when none): itself when it has a
// '/', else the first match in PATH.
std::string FindExecutable(const std::string& name) {
  if (name.find('/') != std::string::npos) return ::access(name.c_str(), X_OK) == 0 ? name : "";
  const char* path = std::getenv("PATH");
  std::stringstream in(path ? path : "");
  for (std::string dir; std::getline(in, dir, ':');) {
    const std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// The 1-, 5- and 15-minute load averages (`uptime`'s figures).
std::vector<double> LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::vector<double> v(3, -1);
  in >> v[0] >> v[1] >> v[2];
  return v;
}

// ---- content ---------------------------------------------------------------

std::string Pattern(uint64_t bytes, uint64_t seed) {
  std::string s(bytes, '\0');
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (uint64_t i = 0; i < bytes; i += 8) {
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    const uint64_t v = x * 0x2545F4914F6CDD1Dull;
    std::memcpy(s.data() + i, &v, std::min<uint64_t>(8, bytes - i));
  }
  return s;
}

// S3's ETag of a single-part object: the quoted hex MD5 of its bytes.
std::string Md5Etag(const std::string& bytes) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  EVP_Digest(bytes.data(), bytes.size(), md, &len, EVP_md5(), nullptr);
  std::string hex = "\"";
  char two[3];
  for (unsigned int i = 0; i < len; ++i) {
    std::snprintf(two, sizeof(two), "%02x", md[i]);
    hex += two;
  }
  return hex + "\"";
}

struct Objects {
  std::vector<std::string> keys;
  std::vector<std::string> original, put_body;       // the bytes of each key
  std::vector<std::string> original_etag, put_etag;  // Md5Etag of each
  std::vector<std::string> get_paths, put_paths;     // presigned, without scheme and host
};

// ---- wrk and its scripts ---------------------------------------------------

std::string LuaString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

std::string LuaList(const std::vector<std::string>& v) {
  std::string out = "{\n";
  for (const auto& s : v) out += "  " + LuaString(s) + ",\n";
  return out + "}";
}

// Shared by both phases: per-thread counters, and done(), which runs in
// wrk's main Lua state and sums every thread's counters with thread:get.
constexpr char kLuaCommon[] = R"LUA(
local threads = {}
function setup(thread)
  thread:set("id", #threads)
  threads[#threads + 1] = thread
end

-- Per wrk thread (each has its own Lua state); globals so thread:get reads them.
issued, s2xx, s3xx, s4xx, s5xx, sother, first_bad = 0, 0, 0, 0, 0, 0, 0
body_ok, body_bad, body_unknown, put_unknown = 0, 0, 0, 0

local function count_status(status)
  if status >= 200 and status < 300 then
    s2xx = s2xx + 1
    return true
  end
  if first_bad == 0 then first_bad = status end
  if status >= 300 and status < 400 then s3xx = s3xx + 1
  elseif status >= 400 and status < 500 then s4xx = s4xx + 1
  elseif status >= 500 and status < 600 then s5xx = s5xx + 1
  else sother = sother + 1 end
  return false
end

local function header(headers, lower_name)
  for name, value in pairs(headers) do
    if string.lower(name) == lower_name then return value end
  end
  return ""
end

local function next_request()
  issued = issued + 1
  local r = reqs[cursor % #reqs + 1]
  cursor = cursor + 1
  return r
end

function done(summary, latency, requests)
  local f = assert(io.open(RESULTS, "w"))
  local function put(name, value) f:write(name, " ", string.format("%.0f", value), "\n") end
  put("threads", #threads)
  put("duration_us", summary.duration)
  put("requests", summary.requests)
  put("bytes", summary.bytes)
  put("err_connect", summary.errors.connect)
  put("err_read", summary.errors.read)
  put("err_write", summary.errors.write)
  put("err_status", summary.errors.status)
  put("err_timeout", summary.errors.timeout)
  put("lat_min_us", latency.min)
  put("lat_max_us", latency.max)
  put("lat_mean_us", latency.mean)
  put("lat_stdev_us", latency.stdev)
  put("lat_p50_us", latency:percentile(50))
  put("lat_p90_us", latency:percentile(90))
  put("lat_p99_us", latency:percentile(99))
  put("lat_p999_us", latency:percentile(99.9))
  for _, name in ipairs({"issued", "s2xx", "s3xx", "s4xx", "s5xx", "sother", "body_ok",
                         "body_bad", "body_unknown", "put_unknown"}) do
    local sum = 0
    for _, t in ipairs(threads) do sum = sum + (t:get(name) or 0) end
    put(name, sum)
  end
  local first = 0
  for _, t in ipairs(threads) do
    local b = t:get("first_bad") or 0
    if first == 0 then first = b end
  end
  put("first_bad_status", first)
  for i = 1, #KEYS do
    local sum = 0
    for _, t in ipairs(threads) do sum = sum + (t:get("put_" .. i) or 0) end
    put("put_ack_" .. (i - 1), sum)
  end
  f:close()
end
)LUA";

// GET: every response names its key (response-content-disposition), and a
// 2xx body must be that key's bytes, compared whole (LuaJIT interns
// strings: one memcmp when they are equal).
constexpr char kLuaGet[] = R"LUA(
function init(args)
  expected, reqs = {}, {}
  for i, key in ipairs(KEYS) do
    local f = assert(io.open(BODIES .. "/" .. key, "rb"))
    expected[key] = f:read("*a")
    f:close()
    reqs[i] = wrk.format("GET", PATHS[i])
  end
  cursor = (id or 0) * math.floor(#reqs / THREADS)
end

function request() return next_request() end

function response(status, headers, body)
  if not count_status(status) then return end
  local want = expected[header(headers, "content-disposition")]
  if want == nil then body_unknown = body_unknown + 1
  elseif body == want then body_ok = body_ok + 1
  else body_bad = body_bad + 1 end
end
)LUA";

// PUT: each key gets a body of its own; a 2xx response's ETag says which
// body the server stored, and counts an acknowledged PUT of that key.
constexpr char kLuaPut[] = R"LUA(
function init(args)
  reqs, etag_index = {}, {}
  for i, key in ipairs(KEYS) do
    local f = assert(io.open(BODIES .. "/" .. key, "rb"))
    reqs[i] = wrk.format("PUT", PATHS[i], {}, f:read("*a"))
    f:close()
    etag_index[ETAGS[i]] = i
  end
  cursor = (id or 0) * math.floor(#reqs / THREADS)
end

function request() return next_request() end

function response(status, headers, body)
  if not count_status(status) then return end
  local i = etag_index[header(headers, "etag")]
  if i == nil then
    put_unknown = put_unknown + 1
    return
  end
  local name = "put_" .. i
  _G[name] = (_G[name] or 0) + 1
end
)LUA";

std::string WriteScript(const std::string& phase, const Objects& o, const std::string& dir,
                        const std::string& results, int threads) {
  std::string s = "-- written by s3d_load, " + phase + " phase\n";
  s += "KEYS = " + LuaList(o.keys) + "\n";
  s += "PATHS = " + LuaList(phase == "get" ? o.get_paths : o.put_paths) + "\n";
  if (phase == "put") s += "ETAGS = " + LuaList(o.put_etag) + "\n";
  s += "BODIES = " + LuaString(dir + "/" + phase) + "\n";
  s += "RESULTS = " + LuaString(results) + "\n";
  s += "THREADS = " + std::to_string(threads) + "\n";
  s += kLuaCommon;
  s += phase == "get" ? kLuaGet : kLuaPut;
  const std::string path = dir + "/" + phase + ".lua";
  return WriteBytes(path, s) ? path : "";
}

struct WrkRun {
  std::string label;  // "get warm-up", "get", ...
  int seconds = 0;
  int exit_code = -1;
  bool killed = false;
  std::string output;                 // what wrk printed
  std::map<std::string, double> fig;  // done()'s figures
  int peak_fds = 0;                   // s3d's, polled while wrk ran
  int peak_backlog = 0;               // connections waiting in s3d's accept queue, polled
  uint64_t peak_rss_polled = 0;
  double wall_s = 0;
  std::vector<std::string> failures;

  double F(const std::string& k) const {
    auto it = fig.find(k);
    return it == fig.end() ? 0 : it->second;
  }
};

WrkRun RunWrk(const Args& a, const std::string& wrk, const std::string& label,
              const std::string& script, const std::string& results, const std::string& url,
              int seconds, pid_t server, int server_port, int fds_before, const std::string& dir) {
  WrkRun r;
  r.label = label;
  r.seconds = seconds;
  std::filesystem::remove(results);
  const std::string log = dir + "/wrk-" + label + ".txt";
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  const std::vector<std::string> argv = {wrk,
                                         "-t" + std::to_string(a.threads),
                                         "-c" + std::to_string(a.connections),
                                         "-d" + std::to_string(seconds) + "s",
                                         "--timeout",
                                         std::to_string(a.timeout_seconds) + "s",
                                         "--latency",
                                         "-s",
                                         script,
                                         url};
  const auto t0 = Clock::now();
  const pid_t pid = Spawn(argv, env, log);
  if (pid < 0) {
    r.failures.push_back(label + ": cannot start " + wrk);
    return r;
  }
  // wrk stops itself after `seconds`; the deadline only guards a hung one.
  const auto deadline = t0 + std::chrono::seconds(seconds + a.timeout_seconds + 60);
  while (true) {
    const int code = WaitExit(pid, std::chrono::milliseconds(200));
    const ProcSample s = Sample(server);
    r.peak_fds = std::max(r.peak_fds, s.fds);
    r.peak_backlog = std::max(r.peak_backlog, ListenBacklog(server, server_port));
    r.peak_rss_polled = std::max(r.peak_rss_polled, s.rss);
    if (code >= 0) {
      r.exit_code = code;
      break;
    }
    if (Clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      r.exit_code = WaitExit(pid, std::chrono::seconds(10));
      r.killed = true;
      break;
    }
  }
  r.wall_s = Seconds(Clock::now() - t0);
  r.output = ReadText(log);
  std::ifstream in(results);
  for (std::string k; in >> k;) {
    double v = 0;
    if (in >> v) r.fig[k] = v;
  }
  if (r.killed) r.failures.push_back(label + ": wrk did not finish; killed");
  // wrk 4.1 counts no error for a connection that is never answered (it
  // has no timer for requests in flight): such connections show here, as
  // fewer sockets open at s3d than wrk holds.
  if (r.peak_fds - fds_before < a.connections) {
    r.failures.push_back(label + ": at most " + std::to_string(r.peak_fds - fds_before) +
                         " of the " + std::to_string(a.connections) +
                         " connections were open at s3d at once (its accept queue held up to " +
                         std::to_string(r.peak_backlog) + "): the rest were never accepted");
  }
  if (r.exit_code != 0) {
    r.failures.push_back(label + ": wrk exited with " + std::to_string(r.exit_code));
  }
  if (r.fig.empty()) {
    r.failures.push_back(label + ": wrk's script wrote no results (" + results + ")");
    return r;
  }
  const auto requests = static_cast<uint64_t>(r.F("requests"));
  if (requests == 0) r.failures.push_back(label + ": no request completed");
  for (const char* e : {"connect", "read", "write", "timeout"}) {
    if (r.F(std::string("err_") + e) > 0) {
      r.failures.push_back(label + ": " +
                           std::to_string(static_cast<uint64_t>(r.F(std::string("err_") + e))) +
                           " socket errors (" + e + ")");
    }
  }
  const uint64_t not_2xx =
      static_cast<uint64_t>(r.F("s3xx") + r.F("s4xx") + r.F("s5xx") + r.F("sother"));
  if (not_2xx > 0 || r.F("err_status") > 0) {
    r.failures.push_back(
        label + ": " + std::to_string(not_2xx) +
        " responses outside 2xx (wrk: " + std::to_string(static_cast<uint64_t>(r.F("err_status"))) +
        " >= 400), the first " + std::to_string(static_cast<int>(r.F("first_bad_status"))));
  }
  if (static_cast<uint64_t>(r.F("s2xx")) + not_2xx != requests) {
    r.failures.push_back(label + ": the script saw " +
                         std::to_string(static_cast<uint64_t>(r.F("s2xx")) + not_2xx) +
                         " responses, wrk counted " + std::to_string(requests));
  }
  for (const char* e : {"body_bad", "body_unknown", "put_unknown"}) {
    if (r.F(e) > 0) {
      r.failures.push_back(label + ": " + std::to_string(static_cast<uint64_t>(r.F(e))) + " " + e +
                           " (a 2xx whose body or ETag is not the object's)");
    }
  }
  return r;
}

json WrkJson(const WrkRun& r, uint64_t object_bytes) {
  const double secs = r.F("duration_us") / 1e6;
  json j = {{"seconds_asked", r.seconds},
            {"wall_seconds", r.wall_s},
            {"exit_code", r.exit_code},
            {"peak_fds_polled", r.peak_fds},
            {"peak_accept_queue_polled", r.peak_backlog},
            {"peak_rss_polled_bytes", r.peak_rss_polled},
            {"failures", r.failures}};
  for (const auto& [k, v] : r.fig) j[k] = v;
  if (secs > 0) {
    j["requests_per_s"] = r.F("requests") / secs;
    j["read_bytes_per_s"] = r.F("bytes") / secs;
    j["payload_bytes_per_s"] = r.F("s2xx") * static_cast<double>(object_bytes) / secs;
  }
  return j;
}

// ---- the server ------------------------------------------------------------

// `xsilo s3d`, stopped (SIGTERM, then SIGKILL) when this goes out of scope.
struct Server {
  pid_t pid = -1;
  int port = 0;
  std::string log;
  ~Server() {
    if (pid > 0 && Alive(pid)) {
      ::kill(pid, SIGTERM);
      if (WaitExit(pid, std::chrono::seconds(10)) < 0) {
        ::kill(pid, SIGKILL);
        WaitExit(pid, std::chrono::seconds(10));
      }
    }
  }
};

std::string Tail(const std::string& text, size_t n = 2000) {
  return text.size() <= n ? text : "..." + text.substr(text.size() - n);
}

// Waits until s3d has at most `target` descriptors open, up to `limit`;
// the seconds it took, or < 0 when the deadline passed.
double WaitForFds(pid_t pid, int target, std::chrono::seconds limit) {
  const auto t0 = Clock::now();
  while (Alive(pid)) {
    const int n = OpenFds(pid);
    if (n >= 0 && n <= target) return Seconds(Clock::now() - t0);
    if (Clock::now() - t0 > limit) return -1;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

Result<std::unique_ptr<S3Client>> MakeClient(int port, const std::string& secret) {
  S3ClientOptions co;
  co.endpoint = "http://127.0.0.1:" + std::to_string(port);
  co.addressing = S3Addressing::kPath;
  co.credentials = StaticCredentials({kAccessKey, secret});
  co.max_connections = 4;
  co.max_retries = 0;  // a failure under test is a finding, not something to retry
  return S3Client::Create(co);
}

// After the GET phase every key holds its original; after the PUT phase a
// key with an acknowledged PUT holds its PUT body, any other key its
// original or its PUT body. Returns failures; counts what it saw.
struct Verified {
  int original = 0, put = 0, put_unacknowledged = 0, wrong = 0;
};

std::vector<std::string> VerifyObjects(S3Client& client, const Objects& o, const WrkRun* put_run,
                                       Verified* v) {
  std::vector<std::string> failures;
  for (size_t i = 0; i < o.keys.size(); ++i) {
    auto got = client.GetObject({.bucket = kBucket, .key = o.keys[i]});
    if (!got.ok()) {
      failures.push_back("verify " + o.keys[i] + ": " + got.status().ToString());
      ++v->wrong;
      continue;
    }
    const std::string_view bytes = got->data.view();
    const bool is_original = bytes == o.original[i];
    const bool is_put = bytes == o.put_body[i];
    const bool acked = put_run && put_run->F("put_ack_" + std::to_string(i)) > 0;
    // The stored ETag must be the MD5 of the bytes the object holds.
    const bool etag_right = (is_original && got->info.etag == o.original_etag[i]) ||
                            (is_put && got->info.etag == o.put_etag[i]);
    bool ok;
    if (put_run == nullptr) {
      ok = is_original && etag_right;
    } else if (acked) {
      ok = is_put && etag_right;
    } else {
      ok = (is_original || is_put) && etag_right;
      if (is_put) ++v->put_unacknowledged;
    }
    if (is_original) ++v->original;
    if (is_put) ++v->put;
    if (!ok) {
      ++v->wrong;
      failures.push_back(
          "verify " + o.keys[i] + ": " + std::to_string(bytes.size()) + " bytes, " +
          (is_original ? "its original"
           : is_put    ? "its PUT body"
                       : "neither body") +
          (put_run ? (acked ? ", after an acknowledged PUT" : ", no PUT acknowledged") : "") +
          ", ETag " + got->info.etag);
    }
  }
  return failures;
}

struct Phase {
  std::string name;
  WrkRun warmup, run;
  ProcSample before, after;
  double settle_s = -1;
  bool alive_after = false;
  Verified verified;
  std::vector<std::string> failures;
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--memory") {
      a.memory = true;
      continue;
    }
    if (k == "--keep") {
      a.keep = true;
      continue;
    }
    if (i + 1 >= argc) return Usage("missing value for " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--xsilo")
        a.xsilo = v;
      else if (k == "--wrk")
        a.wrk = v;
      else if (k == "--connections")
        a.connections = std::stoi(v);
      else if (k == "--seconds")
        a.seconds = std::stoi(v);
      else if (k == "--warmup-seconds")
        a.warmup_seconds = std::stoi(v);
      else if (k == "--threads")
        a.threads = std::stoi(v);
      else if (k == "--objects")
        a.objects = std::stoi(v);
      else if (k == "--object-bytes")
        a.object_bytes = std::stoull(v);
      else if (k == "--dir-root")
        a.dir_root = v;
      else if (k == "--max-connections")
        a.max_connections = std::stoi(v);
      else if (k == "--timeout-seconds")
        a.timeout_seconds = std::stoi(v);
      else if (k == "--settle-seconds")
        a.settle_seconds = std::stoi(v);
      else if (k == "--max-rss-growth-mb")
        a.max_rss_growth_mb = std::stod(v);
      else if (k == "--json")
        a.json = v;
      else
        return Usage("unknown option " + k);
    } catch (const std::exception&) {
      return Usage("bad value for " + k + ": " + v);
    }
  }
  if (a.connections < 1 || a.seconds < 1 || a.warmup_seconds < 0 || a.threads < 1 ||
      a.threads > a.connections || a.objects < 1 || a.object_bytes < 1 || a.timeout_seconds < 1 ||
      a.settle_seconds < 1 || a.max_connections < -1) {
    return Usage(
        "need --connections >= --threads >= 1, --seconds >= 1, --warmup-seconds >= 0, "
        "--objects >= 1, --object-bytes >= 1, --timeout-seconds >= 1, --settle-seconds >= 1");
  }
  if (a.memory && !a.dir_root.empty()) return Usage("--memory and --dir-root are exclusive");
  if (a.max_connections < 0) a.max_connections = a.connections;

  const std::string wrk = FindExecutable(a.wrk);
  if (wrk.empty()) {
    return Usage("wrk not found ('" + a.wrk +
                 "', searched in PATH): install the Debian package wrk "
                 "(scripts/install-deps.sh installs it)");
  }
  if (a.xsilo.empty()) {
    a.xsilo =
        (std::filesystem::path(bench::SelfExe()).parent_path() / ".." / "tools" / "xsilo" / "xsilo")
            .lexically_normal()
            .string();
  }
  if (::access(a.xsilo.c_str(), X_OK) != 0) {
    return Usage("the xsilo binary " + a.xsilo + " is not there (--xsilo PATH)");
  }

  // Descriptors: s3d holds a socket per connection plus a file per GET in
  // flight; wrk a socket per connection. A deployment raises the soft
  // limit the same way (systemd's LimitNOFILE=, `ulimit -n`).
  const uint64_t fds_needed =
      static_cast<uint64_t>(a.connections) + static_cast<uint64_t>(a.max_connections) + 64;
  rlimit nofile{};
  getrlimit(RLIMIT_NOFILE, &nofile);
  const uint64_t nofile_soft_at_start = nofile.rlim_cur;
  if (nofile.rlim_cur != RLIM_INFINITY && nofile.rlim_cur < fds_needed) {
    if (nofile.rlim_max != RLIM_INFINITY && nofile.rlim_max < fds_needed) {
      return Usage("RLIMIT_NOFILE hard limit " + std::to_string(nofile.rlim_max) + " < the " +
                   std::to_string(fds_needed) + " descriptors " + std::to_string(a.connections) +
                   " connections need");
    }
    nofile.rlim_cur = fds_needed;
    if (setrlimit(RLIMIT_NOFILE, &nofile) != 0) return Usage("cannot raise RLIMIT_NOFILE");
  }

  // The working directory: store, bodies, scripts, logs, the secret.
  std::string root =
      a.dir_root.empty() ? std::filesystem::temp_directory_path().string() : a.dir_root;
  std::string templ = root + "/s3d-load-XXXXXX";
  if (::mkdtemp(templ.data()) == nullptr) return Usage("cannot create a directory in " + root);
  const std::string dir = templ;
  struct Cleanup {
    std::string dir;
    bool keep;
    ~Cleanup() {
      if (keep) {
        std::printf("kept %s\n", dir.c_str());
      } else {
        std::error_code ec;
        std::filesystem::remove_all(dir, ec);
      }
    }
  } cleanup{dir, a.keep};
  std::filesystem::create_directories(dir + "/get");
  std::filesystem::create_directories(dir + "/put");

  std::string secret;
  {
    std::random_device rd;
    char hex[9];
    for (int i = 0; i < 5; ++i) {
      std::snprintf(hex, sizeof(hex), "%08x", rd());
      secret += hex;
    }
  }
  const std::string secret_file = dir + "/secret";
  if (!WriteBytes(secret_file, secret + "\n", 0600)) return Usage("cannot write " + secret_file);

  const std::vector<double> load_before = LoadAverage();
  const auto t_start = Clock::now();

  // s3d, with an environment of its own: no idle Buffer cache (which would
  // hold freed object buffers on purpose), no credentials of the caller.
  Server server;
  server.log = dir + "/s3d.log";
  const std::string port_file = dir + "/port";
  std::vector<std::string> s3d_argv = {a.xsilo,
                                       "s3d",
                                       "--host",
                                       "127.0.0.1",
                                       "--port",
                                       "0",
                                       "--port-file",
                                       port_file,
                                       "--access-key",
                                       kAccessKey,
                                       "--secret-key-file",
                                       secret_file,
                                       "--bucket",
                                       kBucket};
  if (a.max_connections > 0) {
    s3d_argv.push_back("--max-connections");
    s3d_argv.push_back(std::to_string(a.max_connections));
  }
  if (a.memory) {
    s3d_argv.push_back("--memory");
  } else {
    s3d_argv.push_back("--dir");
    s3d_argv.push_back(dir + "/store");
  }
  std::vector<std::string> s3d_env;
  for (char** e = environ; *e; ++e) {
    const std::string kv = *e;
    if (kv.rfind("XSILO_BUFFER_CACHE_BYTES=", 0) == 0 || kv.rfind("AWS_", 0) == 0) continue;
    s3d_env.push_back(kv);
  }
  server.pid = Spawn(s3d_argv, s3d_env, server.log);
  if (server.pid < 0) return Usage("cannot start " + a.xsilo);
  {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (server.port == 0) {
      std::ifstream in(port_file);
      if (in >> server.port && server.port > 0) break;
      server.port = 0;
      if (!Alive(server.pid) || Clock::now() > deadline) {
        return Usage("xsilo s3d did not start:\n" + Tail(ReadText(server.log)));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(server.port);
  const ProcSample at_start = Sample(server.pid);

  // The objects, their presigned URLs, and the bodies wrk's scripts read.
  Objects o;
  {
    auto client = MakeClient(server.port, secret);
    if (!client.ok()) return Usage("S3 client: " + client.status().ToString());
    const int width = std::max<int>(3, static_cast<int>(std::to_string(a.objects - 1).size()));
    const auto expires = std::chrono::seconds(
        std::max(3600, 2 * (a.seconds + a.warmup_seconds + a.timeout_seconds) + 600));
    for (int i = 0; i < a.objects; ++i) {
      const std::string digits = std::to_string(i);
      const std::string key =
          "obj-" + std::string(static_cast<size_t>(width) - digits.size(), '0') + digits;
      o.keys.push_back(key);
      o.original.push_back(Pattern(a.object_bytes, static_cast<uint64_t>(i) + 1));
      o.put_body.push_back(Pattern(a.object_bytes, (1ull << 32) + static_cast<uint64_t>(i) + 1));
      o.original_etag.push_back(Md5Etag(o.original.back()));
      o.put_etag.push_back(Md5Etag(o.put_body.back()));
      if (o.put_body.back() == o.original.back()) return Usage("PUT body equals the original");
      if (!WriteBytes(dir + "/get/" + key, o.original.back()) ||
          !WriteBytes(dir + "/put/" + key, o.put_body.back())) {
        return Usage("cannot write the bodies under " + dir);
      }
      PutObjectArgs put{.bucket = kBucket, .key = key};
      put.body.Append(Buffer::CopyFrom(o.original.back()));
      auto r = (*client)->PutObject(put);
      if (!r.ok()) return Usage("PUT " + key + ": " + r.status().ToString());
      if (r->etag != o.original_etag.back()) {
        return Usage("PUT " + key + ": ETag " + r->etag + " is not the MD5 " +
                     o.original_etag.back());
      }
      auto get = (*client)->PresignUrl({.method = "GET",
                                        .bucket = kBucket,
                                        .key = key,
                                        .query = {{"response-content-disposition", key}},
                                        .expires = expires});
      auto put_url = (*client)->PresignUrl(
          {.method = "PUT", .bucket = kBucket, .key = key, .expires = expires});
      if (!get.ok() || !put_url.ok()) return Usage("presign " + key);
      if (get->rfind(url, 0) != 0 || put_url->rfind(url, 0) != 0) {
        return Usage("presigned URL " + *get + " is not under " + url);
      }
      o.get_paths.push_back(get->substr(url.size()));
      o.put_paths.push_back(put_url->substr(url.size()));
    }
  }  // the client and its connections close here
  const double settle_setup =
      WaitForFds(server.pid, at_start.fds, std::chrono::seconds(a.settle_seconds));
  if (settle_setup < 0) {
    return Usage("s3d kept " + std::to_string(OpenFds(server.pid)) + " descriptors (" +
                 std::to_string(at_start.fds) + " at start) after the setup client closed");
  }
  const ProcSample after_setup = Sample(server.pid);

  std::printf(
      "s3d_load: xsilo s3d pid %d on %s, %s, --max-connections %s; %d objects of %llu bytes; "
      "wrk -t%d -c%d, %d s per phase after %d s of warm-up, --timeout %ds; RLIMIT_NOFILE soft "
      "%llu -> %llu\n",
      static_cast<int>(server.pid), url.c_str(), a.memory ? "memory" : (dir + "/store").c_str(),
      a.max_connections > 0 ? std::to_string(a.max_connections).c_str() : "default", a.objects,
      static_cast<unsigned long long>(a.object_bytes), a.threads, a.connections, a.seconds,
      a.warmup_seconds, a.timeout_seconds, static_cast<unsigned long long>(nofile_soft_at_start),
      static_cast<unsigned long long>(nofile.rlim_cur));
  std::printf("s3d at start: RSS %.1f MB, %d fds; with the objects: RSS %.1f MB, %d fds\n",
              at_start.rss / 1e6, at_start.fds, after_setup.rss / 1e6, after_setup.fds);
  std::fflush(stdout);

  std::vector<Phase> phases;
  for (const std::string name : {"get", "put"}) {
    Phase p;
    p.name = name;
    const std::string results = dir + "/" + name + ".results";
    const std::string script = WriteScript(name, o, dir, results, a.threads);
    if (script.empty()) return Usage("cannot write the wrk script under " + dir);
    if (a.warmup_seconds > 0) {
      p.warmup = RunWrk(a, wrk, name + "-warmup", script, results, url, a.warmup_seconds,
                        server.pid, server.port, after_setup.fds, dir);
      for (const auto& f : p.warmup.failures) p.failures.push_back(f);
      if (WaitForFds(server.pid, after_setup.fds, std::chrono::seconds(a.settle_seconds)) < 0) {
        p.failures.push_back(name + " warm-up: s3d's descriptors did not come back to " +
                             std::to_string(after_setup.fds) + " (" +
                             std::to_string(OpenFds(server.pid)) + ")");
      }
    }
    p.before = Sample(server.pid);
    if (!bench::ResetPeakRss(std::to_string(server.pid))) {
      std::fprintf(stderr,
                   "s3d_load: cannot reset s3d's VmHWM (clear_refs): the peak is since "
                   "it started\n");
    }
    p.run = RunWrk(a, wrk, name, script, results, url, a.seconds, server.pid, server.port,
                   p.before.fds, dir);
    for (const auto& f : p.run.failures) p.failures.push_back(f);
    std::printf("\n---- wrk, %s phase ----\n%s", name.c_str(), p.run.output.c_str());
    std::fflush(stdout);
    p.settle_s = WaitForFds(server.pid, p.before.fds, std::chrono::seconds(a.settle_seconds));
    p.after = Sample(server.pid);
    p.alive_after = Alive(server.pid);
    if (!p.alive_after) {
      const int code = WaitExit(server.pid, std::chrono::milliseconds(0));
      server.pid = -1;
      p.failures.push_back(name + ": s3d died (" + ExitText(code) + "); its log:\n" +
                           Tail(ReadText(server.log)));
      phases.push_back(p);
      break;
    }
    if (p.after.fds != p.before.fds) {
      p.failures.push_back(name + ": s3d has " + std::to_string(p.after.fds) +
                           " descriptors open " + std::to_string(a.settle_seconds) +
                           " s after wrk exited, " + std::to_string(p.before.fds) + " before");
    }
    const double growth_mb =
        (static_cast<double>(p.after.rss) - static_cast<double>(p.before.rss)) / 1e6;
    if (growth_mb > a.max_rss_growth_mb) {
      p.failures.push_back(name + ": s3d's RSS grew by " + std::to_string(growth_mb) +
                           " MB (more than --max-rss-growth-mb " +
                           std::to_string(a.max_rss_growth_mb) + ")");
    }
    {
      auto client = MakeClient(server.port, secret);
      if (!client.ok()) {
        p.failures.push_back(name + ": S3 client: " + client.status().ToString());
      } else {
        for (const auto& f :
             VerifyObjects(**client, o, name == "put" ? &p.run : nullptr, &p.verified)) {
          p.failures.push_back(f);
        }
      }
    }
    if (WaitForFds(server.pid, after_setup.fds, std::chrono::seconds(a.settle_seconds)) < 0) {
      p.failures.push_back(name + ": s3d's descriptors did not come back after verifying");
    }
    phases.push_back(p);
  }

  // s3d stops cleanly on SIGTERM (it was up all along: checked per phase).
  int stop_code = -1;
  const bool died = server.pid < 0;
  if (!died) {
    ::kill(server.pid, SIGTERM);
    stop_code = WaitExit(server.pid, std::chrono::seconds(30));
    if (stop_code >= 0) server.pid = -1;
  }
  const std::vector<double> load_after = LoadAverage();
  const double total_s = Seconds(Clock::now() - t_start);

  std::vector<std::string> failures;
  for (const auto& p : phases)
    failures.insert(failures.end(), p.failures.begin(), p.failures.end());
  if (!died && stop_code != 0) {
    failures.push_back("s3d did not stop cleanly on SIGTERM (" + ExitText(stop_code) +
                       "); its log:\n" + Tail(ReadText(server.log)));
  }
  if (phases.size() != 2) failures.push_back("not every phase ran");
  const bool failed = !failures.empty();

  std::printf("\n%-5s %9s %8s %9s %8s %8s %8s %8s | %-22s %-9s | %-20s | %-12s\n", "phase",
              "requests", "req/s", "MB/s", "p50 ms", "p90 ms", "p99 ms", "max ms",
              "errors c/r/w/t/non2xx", "bodies", "RSS MB bef/aft/peak", "fds bef/aft/pk");
  for (const auto& p : phases) {
    const WrkRun& r = p.run;
    const double secs = r.F("duration_us") / 1e6;
    char errors[64], rss[64], fds[64], bodies[32];
    std::snprintf(errors, sizeof(errors), "%.0f/%.0f/%.0f/%.0f/%.0f", r.F("err_connect"),
                  r.F("err_read"), r.F("err_write"), r.F("err_timeout"),
                  r.F("s3xx") + r.F("s4xx") + r.F("s5xx") + r.F("sother"));
    std::snprintf(rss, sizeof(rss), "%.1f/%.1f/%.1f", p.before.rss / 1e6, p.after.rss / 1e6,
                  p.after.hwm / 1e6);
    std::snprintf(fds, sizeof(fds), "%d/%d/%d", p.before.fds, p.after.fds, r.peak_fds);
    std::snprintf(
        bodies, sizeof(bodies), "%s",
        p.verified.wrong == 0 && r.F("body_bad") + r.F("body_unknown") + r.F("put_unknown") == 0
            ? "ok"
            : "WRONG");
    std::printf("%-5s %9.0f %8.1f %9.1f %8.1f %8.1f %8.1f %8.1f | %-22s %-9s | %-20s | %-12s\n",
                p.name.c_str(), r.F("requests"), secs > 0 ? r.F("requests") / secs : 0,
                secs > 0 ? r.F("s2xx") * static_cast<double>(a.object_bytes) / secs / 1e6 : 0,
                r.F("lat_p50_us") / 1e3, r.F("lat_p90_us") / 1e3, r.F("lat_p99_us") / 1e3,
                r.F("lat_max_us") / 1e3, errors, bodies, rss, fds);
  }
  for (const auto& p : phases) {
    std::printf(
        "%s: descriptors back %s; objects afterwards: %d original, %d PUT body (%d "
        "without an acknowledged PUT), %d wrong\n",
        p.name.c_str(),
        p.settle_s >= 0 ? ("after " + std::to_string(p.settle_s) + " s").c_str()
                        : "NOT within the deadline",
        p.verified.original, p.verified.put, p.verified.put_unacknowledged, p.verified.wrong);
  }
  std::printf("load average before %.2f %.2f %.2f, after %.2f %.2f %.2f; %.1f s in all\n",
              load_before[0], load_before[1], load_before[2], load_after[0], load_after[1],
              load_after[2], total_s);

  json j = {{"benchmark", "s3d_load"},
            {"parameters",
             {{"xsilo", a.xsilo},
              {"wrk", wrk},
              {"connections", a.connections},
              {"threads", a.threads},
              {"seconds", a.seconds},
              {"warmup_seconds", a.warmup_seconds},
              {"objects", a.objects},
              {"object_bytes", a.object_bytes},
              {"storage", a.memory ? "memory" : "directory"},
              {"directory", a.memory ? "" : dir + "/store"},
              {"max_connections", a.max_connections},
              {"timeout_seconds", a.timeout_seconds},
              {"settle_seconds", a.settle_seconds},
              {"max_rss_growth_mb", a.max_rss_growth_mb},
              {"rlimit_nofile_soft_at_start", nofile_soft_at_start},
              {"rlimit_nofile_soft", nofile.rlim_cur}}},
            {"load_average_before", load_before},
            {"load_average_after", load_after},
            {"seconds_total", total_s},
            {"s3d_at_start", SampleJson(at_start)},
            {"s3d_with_objects", SampleJson(after_setup)},
            {"s3d_stop_exit_code", stop_code},
            {"failures", failures},
            {"failed", failed}};
  for (const auto& p : phases) {
    j["phases"][p.name] = {
        {"warmup", WrkJson(p.warmup, a.object_bytes)},
        {"run", WrkJson(p.run, a.object_bytes)},
        {"s3d_before", SampleJson(p.before)},
        {"s3d_after", SampleJson(p.after)},
        {"rss_growth_bytes", static_cast<double>(p.after.rss) - static_cast<double>(p.before.rss)},
        {"fds_settle_seconds", p.settle_s},
        {"objects_after",
         {{"original", p.verified.original},
          {"put_body", p.verified.put},
          {"put_body_unacknowledged", p.verified.put_unacknowledged},
          {"wrong", p.verified.wrong}}}};
  }
  std::ofstream(a.json) << j.dump(2) << "\n";
  for (const auto& f : failures) std::printf("FAIL %s\n", f.c_str());
  std::printf("wrote %s: %s\n", a.json.c_str(), failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
