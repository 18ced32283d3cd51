// kill_restart: `xsilo s3d` and `xsilo relay` killed with SIGKILL
// mid-transfer and restarted from their directories, losing no object that
// was acknowledged.
//
//   kill_restart [--xsilo PATH] [--part s3d|relay|both] [--s3d-kills 20]
//                [--relay-kills 10] [--writers 4] [--seed N]
//                [--kill-bytes-min 4MiB] [--kill-bytes-max 64MiB] [--down-ms 0]
//                [--work-dir DIR] [--keep] [--json kill_restart.json]
//
// Part s3d: `xsilo s3d --dir D` runs as a child on a fixed port (chosen
// once, below the kernel's ephemeral range so that no outgoing connection
// takes it while the server is down) with its secret in a 0600 file.
// --writers threads PUT objects with the S3 client, each object a new key
// of 0 B to 12 MiB (those over 5 MiB as multipart uploads of 5 MiB parts).
// Part relay: two endpoints (`xsilo endpoint start --dir`, no peer
// listener, no hole punching) reach each other only through `xsilo relay`
// (its directory: the TLS pair and the admit file); the writers store
// objects on endpoint B through endpoint A's local API (the endpoint
// connector with put_to = B), every put a relayed session.
//
// The bytes of attempt v of key k are a function of (k, v). A failed put
// is retried on the same key as attempt v+1 until one succeeds: that one is
// "acknowledged", and the key is never written again. So "no acknowledged
// object lost" means: at the end every acknowledged key reads back, byte
// for byte, as its acknowledged attempt (not an earlier one, not partial).
// A key whose every attempt failed (a writer gives up 60 s after the stop)
// may be absent or hold one whole attempt, never anything else; the same
// holds when a key is read back before each retry. Nothing that was not
// put may be listed (s3d: LIST, whose sizes and ETags must be those of the
// acknowledged PUTs; the relay: the files of B's directory).
//
// A kill is armed once the server's own sockets (found by port through
// NETLINK_INET_DIAG, the kernel's tcp_info) received a seeded random number
// of bytes, between --kill-bytes-min and --kill-bytes-max, since it last
// started and one put was acknowledged; it fires at the first 2 ms sample
// after that in which a put is in progress and those sockets received more
// bytes (mid-transfer). Then the server is started again (after --down-ms)
// on the same directory, port and credentials, and the writers keep going.
// Figures per kill: bytes at the kill, puts and bytes in flight, the time
// to serve again, the time for both endpoints to register again (relay),
// and the time to the next acknowledged put.
//
// Prints a table and writes JSON. Exits 1 when an acknowledged object is
// lost or corrupt, something not put is visible, a restart fails, the
// endpoints do not register again within 60 s, no put is acknowledged
// after a restart, endpoint A keeps objects, or an endpoint's descriptors
// do not come back to their count before the first kill. Leftover
// temporary files are counted and reported, not failed on.
#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "xsilo/bench/process.h"
#include "xsilo/core/codec.h"
#include "xsilo/s3/client.h"
#include "xsilo/store/connector.h"

namespace {

using namespace xsilo;
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;
namespace fs = std::filesystem;

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kPartBytes = 5 * kMiB;  // the server's least part
constexpr const char* kBucket = "kill-restart";
constexpr auto kRestartDeadline = std::chrono::seconds(30);
constexpr auto kReconnectDeadline = std::chrono::seconds(60);
constexpr auto kResumeDeadline = std::chrono::seconds(60);
constexpr auto kArmDeadline = std::chrono::seconds(60);  // to reach a kill's threshold
constexpr auto kGiveUpAfterStop = std::chrono::seconds(60);

double Since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// ---------------------------------------------------------------- arguments

struct Args {
  std::string xsilo;
  std::string part = "both";
  int s3d_kills = 20;
  int relay_kills = 10;
  int writers = 4;
  uint64_t seed = 0;
  bool seed_given = false;
  uint64_t kill_bytes_min = 4 * kMiB;
  uint64_t kill_bytes_max = 64 * kMiB;
  int64_t down_ms = 0;
  std::string work_dir;
  bool keep = false;
  std::string json = "kill_restart.json";
};

uint64_t ParseBytes(const std::string& s) {
  size_t used = 0;
  const double v = std::stod(s, &used);
  std::string unit = s.substr(used);
  double m = 1;
  if (unit == "KiB" || unit == "K") m = 1024;
  if (unit == "MiB" || unit == "M") m = kMiB;
  if (unit == "GiB" || unit == "G") m = 1024.0 * kMiB;
  return static_cast<uint64_t>(v * m);
}

// ---------------------------------------------------------------- processes

int CountFds(pid_t pid) { return bench::OpenFds(std::to_string(pid)); }

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A child process of ours (an `xsilo` command), its output appended to a log.
// It gets SIGKILL if this program dies (PR_SET_PDEATHSIG: the thread that
// forks is the main thread, which lives until the end).
class Child {
 public:
  Child(std::string name, std::vector<std::string> argv, std::string log)
      : name_(std::move(name)), argv_(std::move(argv)), log_(std::move(log)) {}
  ~Child() { Kill(); }

  bool Spawn() {
    std::vector<char*> argv;
    for (auto& a : argv_) argv.push_back(a.data());
    argv.push_back(nullptr);
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
      }
      // None of this program's sockets (the writers' connections) goes with it.
      close_range(3, ~0u, 0);
      execv(argv[0], argv.data());
      _exit(127);
    }
    pid_ = pid;
    return true;
  }
  // True while the process runs; reaps it (and records how it ended) when it exited.
  bool Alive() {
    if (pid_ <= 0) return false;
    int st = 0;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      last_status_ = st;
      return false;
    }
    return true;
  }
  void Kill() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    waitpid(pid_, &last_status_, 0);
    pid_ = -1;
  }
  // SIGTERM, then SIGKILL after `grace`. True when it ended on SIGTERM.
  bool Stop(std::chrono::milliseconds grace = std::chrono::seconds(10)) {
    if (pid_ <= 0) return true;
    ::kill(pid_, SIGTERM);
    const auto t0 = Clock::now();
    while (Clock::now() - t0 < grace) {
      if (!Alive()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    Kill();
    return false;
  }
  pid_t pid() const { return pid_; }
  const std::string& name() const { return name_; }
  const std::string& log() const { return log_; }
  uint64_t LogSize() const {
    std::error_code ec;
    auto n = fs::file_size(log_, ec);
    return ec ? 0 : n;
  }

 private:
  std::string name_;
  std::vector<std::string> argv_;
  std::string log_;
  pid_t pid_ = -1;
  int last_status_ = 0;
};

// A TCP port on 127.0.0.1 below the ephemeral range that is free now: a
// server killed and started again on it must not find it taken by one of
// the connections this program keeps opening.
int FixedLoopbackPort(std::mt19937_64& rng) {
  int lo = 32768;
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  range >> lo;
  const int top = std::max(2000, lo - 1);
  for (int tries = 0; tries < 200; ++tries) {
    const int port = 1024 + static_cast<int>(rng() % static_cast<uint64_t>(top - 1024));
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    const bool free = fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    if (fd >= 0) ::close(fd);
    if (free) return port;
  }
  return 0;
}

// ---------------------------------------------------------------- traffic

// Bytes received by the TCP sockets whose local port is `port` (a server's
// listener and the connections it accepted), from the kernel's tcp_info
// through NETLINK_INET_DIAG: what the killer watches to fire mid-transfer.
class PortTraffic {
 public:
  explicit PortTraffic(int port) : port_(port) {
    fd_ = ::socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_INET_DIAG);
  }
  ~PortTraffic() {
    if (fd_ >= 0) ::close(fd_);
  }
  bool ok() const { return fd_ >= 0; }

  // Bytes received since the last call by the sockets seen now (new ones
  // count from zero). False when the kernel did not answer.
  bool Sample(uint64_t* received) {
    std::map<uint64_t, uint64_t> now;
    if (!Dump(&now)) return false;
    uint64_t d = 0;
    for (const auto& [cookie, bytes] : now) {
      auto it = last_.find(cookie);
      const uint64_t before = it == last_.end() ? 0 : it->second;
      if (bytes > before) d += bytes - before;
    }
    last_ = std::move(now);
    *received = d;
    return true;
  }

 private:
  bool Dump(std::map<uint64_t, uint64_t>* out) {
    struct {
      nlmsghdr nlh;
      inet_diag_req_v2 req;
    } msg{};
    msg.nlh.nlmsg_len = sizeof(msg);
    msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    msg.req.sdiag_family = AF_INET;
    msg.req.sdiag_protocol = IPPROTO_TCP;
    msg.req.idiag_ext = 1 << (INET_DIAG_INFO - 1);
    msg.req.idiag_states = ~0u;
    sockaddr_nl kernel{};
    kernel.nl_family = AF_NETLINK;
    if (::sendto(fd_, &msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&kernel), sizeof(kernel)) <
        0) {
      return false;
    }
    alignas(nlmsghdr) char buf[32768];
    for (;;) {
      ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return false;
      int len = static_cast<int>(n);
      for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, len); h = NLMSG_NEXT(h, len)) {
        if (h->nlmsg_type == NLMSG_DONE) return true;
        if (h->nlmsg_type == NLMSG_ERROR) return false;
        auto* d = static_cast<inet_diag_msg*>(NLMSG_DATA(h));
        if (ntohs(d->id.idiag_sport) != port_) continue;
        const uint64_t cookie =
            d->id.idiag_cookie[0] | (static_cast<uint64_t>(d->id.idiag_cookie[1]) << 32);
        int rlen = static_cast<int>(h->nlmsg_len - NLMSG_LENGTH(sizeof(*d)));
        for (auto* a = reinterpret_cast<rtattr*>(d + 1); RTA_OK(a, rlen); a = RTA_NEXT(a, rlen)) {
          if (a->rta_type != INET_DIAG_INFO) continue;
          tcp_info ti{};
          std::memcpy(&ti, RTA_DATA(a), std::min<size_t>(RTA_PAYLOAD(a), sizeof(ti)));
          (*out)[cookie] = ti.tcpi_bytes_received;
        }
      }
    }
  }

  int port_;
  int fd_ = -1;
  std::map<uint64_t, uint64_t> last_;
};

// ---------------------------------------------------------------- objects

// The bytes of attempt `version` of `key`.
Buffer Content(const std::string& key, uint32_t version, uint64_t size) {
  Buffer b = std::move(Buffer::Allocate(size)).value();
  if (size == 0) return b;
  uint8_t* p = b.mutable_data();
  uint64_t x =
      Checksum(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(key.data()), key.size())) ^
      (0x9E3779B97F4A7C15ull * (version + 1));
  x |= 1;
  uint64_t i = 0;
  for (; i + 8 <= size; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(p + i, &x, 8);
  }
  for (; i < size; ++i) p[i] = static_cast<uint8_t>(x >> (8 * (i % 8)));
  return b;
}

// Sizes from 0 B to 12 MiB: a twentieth empty, a fifth up to 4 KiB, two
// fifths up to 1 MiB, a fifth up to 5 MiB (single PUTs), the rest above
// 5 MiB (multipart uploads of 2-3 parts on s3d).
uint64_t DrawSize(std::mt19937_64& rng) {
  const double p = std::uniform_real_distribution<double>(0, 1)(rng);
  auto between = [&](uint64_t lo, uint64_t hi) {
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  if (p < 0.05) return 0;
  if (p < 0.25) return between(1, 4096);
  if (p < 0.65) return between(4097, kMiB);
  if (p < 0.87) return between(kMiB + 1, kPartBytes);
  return between(kPartBytes + 1, 12 * kMiB);
}

struct ObjectRecord {
  std::string key;
  uint64_t size = 0;
  uint32_t attempts = 0;       // attempts 0 .. attempts-1 were made
  int64_t acked_version = -1;  // the attempt that returned success
  uint64_t checksum = 0;       // XXH3-64 of the acknowledged bytes
  std::string etag;            // as the acknowledged PUT returned it (s3d)
  std::string last_error;
};

// What the killer sees of the writers.
struct Flight {
  std::atomic<int> puts{0};        // put calls in progress
  std::atomic<int> big_puts{0};    // of them, bodies over 5 MiB (multipart uploads on s3d)
  std::atomic<uint64_t> bytes{0};  // their bodies' bytes
  std::atomic<uint64_t> acked{0}, failed{0};
  std::atomic<bool> stop{false};
  std::atomic<int64_t> give_up_at{0};  // steady-clock ns; 0 until the stop
  // Read back before each retry: a failed attempt found stored whole, and
  // a key found holding anything else (must stay 0).
  std::atomic<uint64_t> failed_but_stored{0}, failed_then_absent{0}, partial_seen{0};
  std::mutex mu;
  std::vector<std::string> partial_examples;
};

// A put of one attempt: the ETag (or "") when it was acknowledged.
using PutFn = std::function<Result<std::string>(const std::string& key, const GatherList& body)>;
using KeyFn = std::function<std::string(int writer, uint64_t seq)>;
// The bytes stored under a key now (nullopt: absent), or an error.
using ReadFn = std::function<Result<std::optional<Buffer>>(const std::string& key)>;

// Whether `b` are the bytes of attempt `v` of `o` (every attempt of an
// empty object is the same empty object).
bool IsAttempt(const ObjectRecord& o, const Buffer& b, uint32_t v) {
  if (b.size() != o.size) return false;
  if (o.size == 0) return true;
  Buffer c = Content(o.key, v, o.size);
  return std::memcmp(b.data(), c.data(), o.size) == 0;
}

// The first attempt of `o` whose bytes `b` are, or -1.
int64_t WhichAttempt(const ObjectRecord& o, const Buffer& b) {
  for (uint32_t v = 0; v < o.attempts; ++v) {
    if (IsAttempt(o, b, v)) return v;
  }
  return -1;
}

void Writer(int w, uint64_t seed, const KeyFn& key_of, const PutFn& put, const ReadFn& read,
            Flight& flight, std::vector<ObjectRecord>* out) {
  std::mt19937_64 rng(seed * 1000003 + static_cast<uint64_t>(w));
  for (uint64_t seq = 0; !flight.stop; ++seq) {
    ObjectRecord r;
    r.key = key_of(w, seq);
    r.size = DrawSize(rng);
    for (;;) {
      const uint32_t v = r.attempts++;
      Buffer bytes = Content(r.key, v, r.size);
      GatherList body;
      if (r.size) body.Append(bytes);
      const bool big = r.size > kPartBytes;
      flight.bytes += r.size;
      flight.big_puts += big;
      ++flight.puts;
      auto got = put(r.key, body);
      --flight.puts;
      flight.big_puts -= big;
      flight.bytes -= r.size;
      if (got.ok()) {
        r.acked_version = v;
        r.checksum = Checksum(body);
        r.etag = *got;
        ++flight.acked;
        break;
      }
      ++flight.failed;
      r.last_error = got.status().ToString();
      const int64_t give_up = flight.give_up_at;
      if (give_up != 0 && Clock::now().time_since_epoch().count() > give_up) break;
      // A pause before the next attempt, growing a little while the server is down.
      std::this_thread::sleep_for(std::chrono::milliseconds(20 * (1 + std::min<uint32_t>(v, 9))));
      // What the failed attempts left: nothing, one of them whole, or (a
      // partial object visible) something else. Not known while the server
      // is still down.
      auto now = read(r.key);
      if (!now.ok()) continue;
      if (!now->has_value()) {
        ++flight.failed_then_absent;
      } else if (WhichAttempt(r, **now) >= 0) {
        ++flight.failed_but_stored;
      } else {
        ++flight.partial_seen;
        std::lock_guard<std::mutex> lock(flight.mu);
        if (flight.partial_examples.size() < 5) {
          flight.partial_examples.push_back("after a failed put, " + r.key + " held " +
                                            std::to_string((*now)->size()) + " of " +
                                            std::to_string(r.size) + " bytes: not a whole attempt");
        }
      }
    }
    out->push_back(std::move(r));
  }
}

// ---------------------------------------------------------------- kills

struct KillRecord {
  int n = 0;
  uint64_t threshold = 0;        // bytes to receive before arming
  uint64_t received = 0;         // bytes the server's sockets received since its start
  int puts_in_flight = 0;        // at the kill
  int big_puts_in_flight = 0;    // of them, over 5 MiB (multipart on s3d)
  uint64_t bytes_in_flight = 0;  // the bodies of those puts
  bool mid_transfer = false;     // puts in flight and bytes arriving in the last sample
  double uptime_s = 0;           // from ready to the kill
  double restart_s = 0;          // from the kill to ready again
  double noticed_s = -1;         // relay: until both endpoints saw it gone
  double reconnect_s = -1;       // relay: from ready until both endpoints registered
  double first_ack_s = -1;       // from ready until the next acknowledged put
  bool restarted = false;
};

struct Server {
  std::function<bool()> start;          // (re)starts it and waits until it serves
  std::function<void()> kill;           // SIGKILL and reap
  std::chrono::milliseconds down{0};    // how long it stays dead before the restart
  std::function<double()> after_kill;   // relay: waits until the endpoints noticed; -1 if not
  std::function<double()> after_start;  // relay: waits until both registered again; -1 if not
};

// Waits for the state a kill needs: `threshold` bytes received since the
// start, a put acknowledged since then (its time from `ready` goes to
// *first_ack_s), and at that sample a put in progress with bytes arriving.
// Fills the record; false when the state was not reached within
// kArmDeadline (the kill then happens anyway, not mid-transfer).
bool AwaitMidTransfer(PortTraffic& traffic, Flight& flight, uint64_t acked_at_start,
                      Clock::time_point ready, double* first_ack_s, KillRecord* k) {
  const auto deadline = Clock::now() + kArmDeadline;
  while (Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    uint64_t d = 0;
    if (!traffic.Sample(&d)) continue;
    k->received += d;
    const int puts = flight.puts;
    if (*first_ack_s < 0 && flight.acked > acked_at_start) *first_ack_s = Since(ready);
    if (*first_ack_s >= 0 && k->received >= k->threshold && puts > 0 && d > 0) {
      k->puts_in_flight = puts;
      k->big_puts_in_flight = flight.big_puts;
      k->bytes_in_flight = flight.bytes;
      k->mid_transfer = true;
      return true;
    }
  }
  k->puts_in_flight = flight.puts;
  k->big_puts_in_flight = flight.big_puts;
  k->bytes_in_flight = flight.bytes;
  return false;
}

// Kills the server `kills` times while the writers run, starting it again
// after each kill; then lets the writers put a few more objects and stops
// them. Each record's first_ack_s is measured after its own restart.
void KillLoop(int kills, int writers, uint64_t min_bytes, uint64_t max_bytes, std::mt19937_64& rng,
              PortTraffic& traffic, Flight& flight, Server& server,
              std::vector<KillRecord>* records) {
  Clock::time_point ready = Clock::now();
  uint64_t acked_at_start = flight.acked;
  for (int n = 1; n <= kills; ++n) {
    KillRecord k;
    k.n = n;
    k.threshold = std::uniform_int_distribution<uint64_t>(min_bytes, max_bytes)(rng);
    uint64_t ignored = 0;
    traffic.Sample(&ignored);  // counts from here
    double first_ack = -1;
    AwaitMidTransfer(traffic, flight, acked_at_start, ready, &first_ack, &k);
    if (!records->empty()) records->back().first_ack_s = first_ack;
    k.uptime_s = Since(ready);
    const auto killed = Clock::now();
    server.kill();
    if (server.after_kill) k.noticed_s = server.after_kill();
    // An outage of --down-ms: part of the fault, not a wait for anything.
    if (server.down.count() > 0) std::this_thread::sleep_until(killed + server.down);
    k.restarted = server.start();
    k.restart_s = Since(killed);
    ready = Clock::now();
    acked_at_start = flight.acked;
    if (k.restarted && server.after_start) k.reconnect_s = server.after_start();
    records->push_back(k);
    std::printf(
        "  kill %2d: %6.1f MiB received (armed at %5.1f), %d puts in flight (%d over 5 MiB, "
        "%5.1f MiB)%s, serving again %.3f s after the kill",
        n, k.received / double(kMiB), k.threshold / double(kMiB), k.puts_in_flight,
        k.big_puts_in_flight, k.bytes_in_flight / double(kMiB),
        k.mid_transfer ? "" : " [not mid-transfer]", k.restart_s);
    if (server.after_start && k.reconnect_s >= 0) {
      std::printf(", endpoints registered %.3f s later", k.reconnect_s);
    } else if (server.after_start && k.restarted) {
      std::printf(", endpoints NOT registered again within %lld s",
                  static_cast<long long>(kReconnectDeadline.count()));
    }
    std::printf("\n");
    std::fflush(stdout);
    // A server that did not come back (or was not rejoined) is the finding: no more kills.
    if (!k.restarted || (server.after_start && k.reconnect_s < 0)) break;
  }
  // After the last restart the writers go on until they put two objects
  // each (or the deadline), then stop.
  const auto deadline = Clock::now() + kResumeDeadline;
  double first_ack = -1;
  const uint64_t enough = acked_at_start + 2 * static_cast<uint64_t>(writers);
  while (Clock::now() < deadline && flight.acked < enough) {
    if (first_ack < 0 && flight.acked > acked_at_start) first_ack = Since(ready);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  if (first_ack < 0 && flight.acked > acked_at_start) first_ack = Since(ready);
  if (!records->empty()) records->back().first_ack_s = first_ack;
  flight.give_up_at = (Clock::now() + kGiveUpAfterStop).time_since_epoch().count();
  flight.stop = true;
}

// ---------------------------------------------------------------- results

struct PartResult {
  std::string part;
  int kills_planned = 0;
  std::vector<KillRecord> kills;
  uint64_t objects = 0;             // keys written
  uint64_t puts_acked = 0;          // = keys acknowledged
  uint64_t puts_failed = 0;         // attempts that returned an error
  uint64_t keys_unacked = 0;        // every attempt failed
  uint64_t failed_but_stored = 0;   // read before a retry: a failed attempt stored whole
  uint64_t failed_then_absent = 0;  // read before a retry: nothing stored
  uint64_t unacked_absent = 0, unacked_whole = 0;
  uint64_t lost = 0;     // acknowledged, then missing or unreadable
  uint64_t corrupt = 0;  // readable but not the acknowledged bytes (or not a whole attempt)
  uint64_t stray = 0;    // visible but never put
  uint64_t listing_mismatch = 0;  // s3d: listed size or ETag unlike the acknowledged PUT's
  uint64_t bytes_acked = 0;
  uint64_t temp_files = 0;                         // temporary files left in the directory
  uint64_t orphan_meta = 0;                        // s3d: metadata files without their object
  uint64_t multipart_left = 0;                     // s3d: uploads neither completed nor aborted
  uint64_t objects_at_requester = 0;               // relay: objects endpoint A keeps (must be 0)
  std::map<std::string, std::pair<int, int>> fds;  // relay: endpoint -> (before, after)
  bool fds_back = true;
  double first_registration_s = -1;  // relay: from its first start until both endpoints registered
  bool restarts_ok = true;
  bool reconnects_ok = true;
  bool resumed_ok = true;
  double seconds = 0;
  std::vector<std::string> problems;
  std::vector<std::string> examples;  // a few lost/corrupt keys, for a repro

  bool failed() const {
    return lost || corrupt || stray || listing_mismatch || !restarts_ok || !reconnects_ok ||
           !resumed_ok || objects_at_requester || !fds_back || puts_acked == 0 || !problems.empty();
  }
};

void Example(PartResult* r, const std::string& what) {
  if (r->examples.size() < 10) r->examples.push_back(what);
}

struct Stats {
  double median = -1, max = -1;
  int n = 0;
};
Stats StatsOf(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return x < 0; }), v.end());
  Stats s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  s.median = v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
  s.max = v.back();
  return s;
}

// Reads every key the writers tried back through `read` and checks it:
// an acknowledged key must hold its acknowledged attempt, byte for byte;
// a key whose every attempt failed must be absent or hold one whole
// attempt. `through` names the path in the examples; the unacknowledged
// keys' figures are counted when `count_unacked`.
void Verify(const std::vector<std::vector<ObjectRecord>>& logs, const ReadFn& read,
            const std::string& through, bool count_unacked, PartResult* r) {
  for (const auto& log : logs) {
    for (const ObjectRecord& o : log) {
      Result<std::optional<Buffer>> got = Unavailable("not read");
      for (int tries = 0; tries < 5; ++tries) {
        got = read(o.key);
        if (got.ok()) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
      const std::string acked = "acknowledged as attempt " + std::to_string(o.acked_version);
      if (o.acked_version >= 0) {
        if (!got.ok() || !got->has_value()) {
          ++r->lost;
          Example(r, "lost (" + through + "): " + o.key + " " + acked + ": " +
                         (got.ok() ? "absent" : got.status().ToString()));
        } else if (!IsAttempt(o, **got, static_cast<uint32_t>(o.acked_version))) {
          ++r->corrupt;
          const int64_t v = WhichAttempt(o, **got);
          Example(r, "corrupt (" + through + "): " + o.key + " " + acked + " holds " +
                         std::to_string((*got)->size()) + " of " + std::to_string(o.size) +
                         " bytes: " +
                         (v >= 0 ? "attempt " + std::to_string(v) : "not a whole attempt"));
        }
        continue;
      }
      if (!got.ok()) {
        ++r->corrupt;
        Example(r, "unreadable unacknowledged key (" + through + "): " + o.key + ": " +
                       got.status().ToString());
      } else if (!got->has_value()) {
        if (count_unacked) ++r->unacked_absent;
      } else if (WhichAttempt(o, **got) >= 0) {
        if (count_unacked) ++r->unacked_whole;
      } else {
        ++r->corrupt;
        Example(r, "partial (" + through + "): unacknowledged " + o.key + " holds " +
                       std::to_string((*got)->size()) + " of " + std::to_string(o.size) + " bytes");
      }
    }
  }
}

void Tally(const std::vector<std::vector<ObjectRecord>>& logs, Flight& flight, PartResult* r) {
  for (const auto& log : logs) {
    for (const ObjectRecord& o : log) {
      ++r->objects;
      if (o.acked_version >= 0) {
        ++r->puts_acked;
        r->bytes_acked += o.size;
      } else {
        ++r->keys_unacked;
      }
    }
  }
  r->puts_failed = flight.failed;
  r->failed_but_stored = flight.failed_but_stored;
  r->failed_then_absent = flight.failed_then_absent;
  r->corrupt += flight.partial_seen;
  for (const auto& e : flight.partial_examples) Example(r, e);
}

// ---------------------------------------------------------------- part s3d

PartResult RunS3d(const Args& a, const std::string& work, std::mt19937_64& rng) {
  PartResult r;
  r.part = "s3d";
  r.kills_planned = a.s3d_kills;
  const auto t0 = Clock::now();
  const std::string dir = work + "/s3d", secret = work + "/s3d.secret",
                    port_file = work + "/s3d.port", log = work + "/s3d.log";
  fs::create_directories(dir);
  const std::string secret_key = "kill-restart-secret-" + std::to_string(rng());
  {
    const int fd = ::open(secret.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    const std::string line = secret_key + "\n";
    if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
      r.problems.push_back("cannot write " + secret);
      r.restarts_ok = false;
      if (fd >= 0) ::close(fd);
      return r;
    }
    ::close(fd);
  }
  const int port = FixedLoopbackPort(rng);
  if (port == 0) {
    r.problems.push_back("no free port below the ephemeral range");
    r.restarts_ok = false;
    return r;
  }
  Child s3d(
      "s3d",
      {a.xsilo, "s3d", "--dir", dir, "--port", std::to_string(port), "--access-key", "kill-restart",
       "--secret-key-file", secret, "--bucket", kBucket, "--port-file", port_file},
      log);
  // Started (again) on the same directory, port and credentials; ready when
  // it wrote the port it bound. A port still taken makes it exit: tried
  // again until the deadline.
  auto start = [&]() {
    const auto deadline = Clock::now() + kRestartDeadline;
    while (Clock::now() < deadline) {
      fs::remove(port_file);
      if (!s3d.Spawn()) return false;
      while (Clock::now() < deadline && s3d.Alive()) {
        if (fs::exists(port_file) && std::atoi(ReadText(port_file).c_str()) == port) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  std::printf("s3d: port %d, directory %s\n", port, dir.c_str());
  if (!start()) {
    r.problems.push_back("s3d did not start (" + log + ")");
    r.restarts_ok = false;
    return r;
  }
  S3ClientOptions co;
  co.endpoint = "http://127.0.0.1:" + std::to_string(port);
  co.credentials = StaticCredentials({"kill-restart", secret_key});
  co.connect_timeout = std::chrono::seconds(2);
  co.stall_timeout = std::chrono::seconds(10);
  co.max_connections = 16;
  auto client = S3Client::Create(co);
  if (!client.ok()) {
    r.problems.push_back("S3 client: " + client.status().ToString());
    return r;
  }
  S3Client& c = **client;

  Flight flight;
  std::vector<std::vector<ObjectRecord>> logs(static_cast<size_t>(a.writers));
  KeyFn key_of = [](int w, uint64_t seq) {
    char k[64];
    std::snprintf(k, sizeof(k), "w%d/%06llu", w, static_cast<unsigned long long>(seq));
    return std::string(k);
  };
  PutFn put = [&](const std::string& key, const GatherList& body) -> Result<std::string> {
    if (body.size > kPartBytes) {
      auto u = c.UploadObject(
          {.bucket = kBucket, .key = key, .body = body, .part_size = kPartBytes, .concurrency = 3});
      if (!u.ok()) return u.status();
      return u->etag;
    }
    auto p = c.PutObject({.bucket = kBucket, .key = key, .body = body});
    if (!p.ok()) return p.status();
    return p->etag;
  };
  ReadFn read = [&](const std::string& key) -> Result<std::optional<Buffer>> {
    auto g = c.GetObject({.bucket = kBucket, .key = key});
    if (g.ok()) return std::optional<Buffer>(std::move(g->data));
    if (g.status().code() == StatusCode::kNotFound) return std::optional<Buffer>();
    return g.status();
  };
  std::vector<std::thread> writers;
  for (int w = 0; w < a.writers; ++w) {
    writers.emplace_back(
        [&, w] { Writer(w, a.seed, key_of, put, read, flight, &logs[static_cast<size_t>(w)]); });
  }

  PortTraffic traffic(port);
  Server server;
  server.start = start;
  server.kill = [&] { s3d.Kill(); };
  server.down = std::chrono::milliseconds(a.down_ms);
  KillLoop(a.s3d_kills, a.writers, a.kill_bytes_min, a.kill_bytes_max, rng, traffic, flight, server,
           &r.kills);
  for (auto& t : writers) t.join();
  for (const auto& k : r.kills) {
    if (!k.restarted) r.restarts_ok = false;
    if (k.first_ack_s < 0) r.resumed_ok = false;
  }
  if (static_cast<int>(r.kills.size()) < a.s3d_kills) r.restarts_ok = false;
  Tally(logs, flight, &r);

  // Every key read back; then the listing against what was put.
  if (s3d.Alive()) {
    Verify(logs, read, "GET", true, &r);
    std::map<std::string, const ObjectRecord*> tried;
    for (const auto& log : logs)
      for (const auto& o : log) tried[o.key] = &o;
    auto list = c.ListObjects({.bucket = kBucket, .fetch_all = true});
    if (!list.ok()) {
      r.problems.push_back("LIST: " + list.status().ToString());
      ++r.listing_mismatch;
    } else {
      std::set<std::string> listed;
      for (const auto& obj : list->objects) {
        listed.insert(obj.key);
        auto it = tried.find(obj.key);
        if (it == tried.end()) {
          ++r.stray;
          Example(&r, "stray: LIST shows " + obj.key + " (" + std::to_string(obj.size) +
                          " bytes), never put");
          continue;
        }
        const ObjectRecord& o = *it->second;
        if (obj.size != o.size || (o.acked_version >= 0 && obj.etag != o.etag)) {
          ++r.listing_mismatch;
          Example(&r, "listing: " + obj.key + " listed " + std::to_string(obj.size) + " bytes " +
                          obj.etag + ", put " + std::to_string(o.size) + " bytes " + o.etag);
        }
      }
      for (const auto& [key, o] : tried) {
        if (o->acked_version >= 0 && !listed.count(key)) {
          ++r.listing_mismatch;
          Example(&r, "listing: acknowledged " + key + " not listed");
        }
      }
    }
    auto uploads = c.ListMultipartUploads({.bucket = kBucket});
    if (uploads.ok()) r.multipart_left = uploads->size();
  } else {
    r.problems.push_back("s3d is not running at the end (" + log + ")");
    r.restarts_ok = false;
  }
  if (!s3d.Stop()) r.problems.push_back("s3d did not stop on SIGTERM");
  // What the kills left in the directory (after a clean stop).
  std::error_code ec;
  const std::string bucket_dir = dir + "/" + kBucket;
  for (const auto& e : fs::directory_iterator(bucket_dir + "/.xsilo-tmp", ec)) {
    (void)e;
    ++r.temp_files;
  }
  for (const auto& e : fs::directory_iterator(bucket_dir + "/.xsilo-meta", ec)) {
    if (!fs::exists(bucket_dir + "/" + e.path().filename().string())) ++r.orphan_meta;
  }
  r.seconds = Since(t0);
  return r;
}

// ---------------------------------------------------------------- part relay

struct EndpointProc {
  std::unique_ptr<Child> child;
  std::string dir, port_file;
  int port = 0;
  std::string uuid, fingerprint;
};

// The endpoint's /status ("registered", "objects"); nullopt when it did not
// answer. One connection per call, closed by both sides after the reply, so
// that polling leaves no idle connection in the endpoint's descriptor count.
std::optional<json> EndpointStatus(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return std::nullopt;
  timeval tv{2, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::string reply;
  const std::string req = "GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 &&
      ::send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
    char buf[4096];
    for (ssize_t n; (n = ::recv(fd, buf, sizeof(buf), 0)) > 0;) reply.append(buf, n);
  }
  ::close(fd);
  const size_t body = reply.find("\r\n\r\n");
  if (reply.rfind("HTTP/1.1 200", 0) != 0 || body == std::string::npos) return std::nullopt;
  auto j = json::parse(reply.substr(body + 4), nullptr, false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

bool Registered(int port) {
  auto s = EndpointStatus(port);
  return s && s->value("registered", false);
}

PartResult RunRelay(const Args& a, const std::string& work, std::mt19937_64& rng) {
  PartResult r;
  r.part = "relay";
  r.kills_planned = a.relay_kills;
  const auto t0 = Clock::now();
  const std::string relay_dir = work + "/relay";
  fs::create_directories(relay_dir);
  const int relay_port = FixedLoopbackPort(rng);
  if (relay_port == 0) {
    r.problems.push_back("no free port below the ephemeral range");
    r.restarts_ok = false;
    return r;
  }
  const std::string relay_addr = "127.0.0.1:" + std::to_string(relay_port);
  // The relay's TLS pair first: the endpoints verify the relay with its cert.
  {
    Child tls("tls", {a.xsilo, "tls", "self-signed", "--dir", relay_dir + "/tls"},
              work + "/tls.log");
    tls.Spawn();
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    while (tls.Alive() && Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!fs::exists(relay_dir + "/tls/cert.pem")) {
      r.problems.push_back("xsilo tls self-signed wrote no certificate (" + work + "/tls.log)");
      r.restarts_ok = false;
      return r;
    }
  }
  // Two endpoints, neither with a peer listener and no hole punching: a
  // call from one to the other can only take the relay's pipe.
  std::map<std::string, EndpointProc> eps;
  for (const char* name : {"A", "B"}) {
    EndpointProc& e = eps[name];
    e.dir = work + "/endpoint-" + name;
    e.port_file = work + "/endpoint-" + name + ".port";
    e.child = std::make_unique<Child>(
        std::string("endpoint-") + name,
        std::vector<std::string>{a.xsilo, "endpoint", "start", "--listen", "127.0.0.1:0",
                                 "--port-file", e.port_file, "--relay", relay_addr, "--relay-ca",
                                 relay_dir + "/tls/cert.pem", "--dir", e.dir, "--no-punch",
                                 "--io-timeout-ms", "15000"},
        work + "/endpoint-" + name + ".log");
    if (!e.child->Spawn()) {
      r.problems.push_back(std::string("cannot start endpoint ") + name);
      r.restarts_ok = false;
      return r;
    }
  }
  for (auto& [name, e] : eps) {
    const auto deadline = Clock::now() + kRestartDeadline;
    while (Clock::now() < deadline && e.child->Alive() && !fs::exists(e.port_file))
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    e.port = std::atoi(ReadText(e.port_file).c_str());
    // "endpoint <uuid> local API on port <p>, peer port <q>, certificate <fp>, relay ..."
    std::istringstream line(ReadText(e.child->log()));
    for (std::string l; std::getline(line, l);) {
      if (l.rfind("endpoint ", 0) != 0) continue;
      std::istringstream words(l);
      std::string w;
      words >> w >> e.uuid;
      auto c = l.find("certificate ");
      if (c != std::string::npos) e.fingerprint = l.substr(c + 12, 64);
    }
    if (e.port == 0 || e.uuid.empty() || e.fingerprint.size() != 64) {
      r.problems.push_back("endpoint " + name + " did not start (" + e.child->log() + ")");
      r.restarts_ok = false;
      return r;
    }
  }
  {
    std::ofstream admit(relay_dir + "/admit");
    for (auto& [name, e] : eps) admit << e.fingerprint << "  # endpoint " << name << "\n";
  }
  Child relay("relay",
              {a.xsilo, "relay", "--listen", relay_addr, "--tls-self-signed", relay_dir + "/tls",
               "--admit", relay_dir + "/admit"},
              work + "/relay.log");
  // Ready once it printed its port after this start.
  auto start = [&]() {
    const auto deadline = Clock::now() + kRestartDeadline;
    while (Clock::now() < deadline) {
      const uint64_t from = relay.LogSize();
      if (!relay.Spawn()) return false;
      while (Clock::now() < deadline && relay.Alive()) {
        const std::string text = ReadText(relay.log());
        if (text.size() > from && text.find("relay on port", from) != std::string::npos)
          return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return false;
  };
  auto both_registered = [&]() -> double {
    const auto t = Clock::now();
    while (Clock::now() - t < kReconnectDeadline) {
      if (Registered(eps["A"].port) && Registered(eps["B"].port)) return Since(t);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  };
  auto both_unregistered = [&]() -> double {
    const auto t = Clock::now();
    while (Clock::now() - t < std::chrono::seconds(10)) {
      if (!Registered(eps["A"].port) && !Registered(eps["B"].port)) return Since(t);
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return -1;
  };
  std::printf("relay: %s (directory %s); endpoint A %s (port %d), B %s (port %d)\n",
              relay_addr.c_str(), relay_dir.c_str(), eps["A"].uuid.c_str(), eps["A"].port,
              eps["B"].uuid.c_str(), eps["B"].port);
  if (!start()) {
    r.problems.push_back("the relay did not start (" + relay.log() + ")");
    r.restarts_ok = false;
    return r;
  }
  const double first_registration = both_registered();
  if (first_registration < 0) {
    r.problems.push_back("the endpoints did not register with the relay at all");
    r.reconnects_ok = false;
    return r;
  }
  r.first_registration_s = first_registration;
  std::printf("relay: endpoints first registered %.3f s after the relay started\n",
              first_registration);
  const std::string uuid_b = eps["B"].uuid;
  auto via_a = MakeConnector({"endpoint",
                              {{"address", "127.0.0.1:" + std::to_string(eps["A"].port)},
                               {"put_to", uuid_b},
                               {"timeout_ms", "30000"}}});
  auto via_b = MakeConnector(
      {"endpoint",
       {{"address", "127.0.0.1:" + std::to_string(eps["B"].port)}, {"timeout_ms", "30000"}}});
  if (!via_a.ok() || !via_b.ok()) {
    r.problems.push_back("endpoint connector: " +
                         (via_a.ok() ? via_b.status() : via_a.status()).ToString());
    return r;
  }
  Connector& conn_a = **via_a;
  Connector& conn_b = **via_b;
  // Descriptors of the endpoints once registered, idle: where they must come back to.
  for (auto& [name, e] : eps) r.fds[name] = {CountFds(e.child->pid()), -1};

  Flight flight;
  std::vector<std::vector<ObjectRecord>> logs(static_cast<size_t>(a.writers));
  KeyFn key_of = [&](int, uint64_t) { return conn_a.NewKey().value().id; };
  auto key_for = [&](const std::string& id) {
    return Key{"endpoint", id, 0, {{"endpoint", uuid_b}}};
  };
  PutFn put = [&](const std::string& id, const GatherList& body) -> Result<std::string> {
    Status s = conn_a.Set(key_for(id), body);
    if (!s.ok()) return s;
    return std::string();
  };
  ReadFn read_a = [&](const std::string& id) { return conn_a.Get(key_for(id)); };
  ReadFn read_b = [&](const std::string& id) { return conn_b.Get(key_for(id)); };
  std::vector<std::thread> writers;
  for (int w = 0; w < a.writers; ++w) {
    writers.emplace_back(
        [&, w] { Writer(w, a.seed, key_of, put, read_a, flight, &logs[static_cast<size_t>(w)]); });
  }

  PortTraffic traffic(relay_port);
  Server server;
  server.start = start;
  server.kill = [&] { relay.Kill(); };
  server.down = std::chrono::milliseconds(a.down_ms);
  server.after_kill = both_unregistered;
  server.after_start = both_registered;
  KillLoop(a.relay_kills, a.writers, a.kill_bytes_min, a.kill_bytes_max, rng, traffic, flight,
           server, &r.kills);
  for (auto& t : writers) t.join();
  for (const auto& k : r.kills) {
    if (!k.restarted) r.restarts_ok = false;
    if (k.reconnect_s < 0) r.reconnects_ok = false;
    if (k.first_ack_s < 0) r.resumed_ok = false;
  }
  if (static_cast<int>(r.kills.size()) < a.relay_kills) r.restarts_ok = false;
  Tally(logs, flight, &r);

  // Every key through A (relayed from B) and through B (its own).
  Verify(logs, read_a, "A", true, &r);
  Verify(logs, read_b, "B", false, &r);
  // B's objects against what was put; A keeps none.
  std::set<std::string> tried;
  for (const auto& log : logs)
    for (const auto& o : log) tried.insert(o.key);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(eps["B"].dir + "/objects", ec)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0) {
      ++r.temp_files;
    } else if (!tried.count(name)) {
      ++r.stray;
      Example(&r, "stray: endpoint B holds " + name + ", never put");
    }
  }
  for (const auto& e : fs::directory_iterator(eps["A"].dir + "/objects", ec)) {
    (void)e;
    ++r.objects_at_requester;
  }
  // The endpoints' descriptors back where they were before the first kill
  // (connections close on their own: waited for, with a deadline).
  const auto fd_deadline = Clock::now() + std::chrono::seconds(20);
  for (;;) {
    bool back = true;
    for (auto& [name, e] : eps) {
      r.fds[name].second = CountFds(e.child->pid());
      back = back && r.fds[name].second <= r.fds[name].first;
    }
    r.fds_back = back;
    if (back || Clock::now() > fd_deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!relay.Alive()) r.problems.push_back("the relay is not running at the end");
  for (auto& [name, e] : eps) {
    if (!e.child->Alive())
      r.problems.push_back("endpoint " + name + " died (" + e.child->log() + ")");
  }
  relay.Stop();
  for (auto& [name, e] : eps) e.child->Stop();
  r.seconds = Since(t0);
  return r;
}

// ---------------------------------------------------------------- output

std::string Fmt(const Stats& s) {
  if (s.n == 0) return "-";
  char b[64];
  std::snprintf(b, sizeof(b), "%.3f/%.3f", s.median, s.max);
  return b;
}

json ToJson(const PartResult& r) {
  json kills = json::array();
  std::vector<double> restart, reconnect, first_ack, noticed;
  int mid = 0;
  for (const auto& k : r.kills) {
    kills.push_back({{"n", k.n},
                     {"threshold_bytes", k.threshold},
                     {"received_bytes", k.received},
                     {"puts_in_flight", k.puts_in_flight},
                     {"big_puts_in_flight", k.big_puts_in_flight},
                     {"bytes_in_flight", k.bytes_in_flight},
                     {"mid_transfer", k.mid_transfer},
                     {"uptime_s", k.uptime_s},
                     {"restart_s", k.restart_s},
                     {"noticed_s", k.noticed_s},
                     {"reconnect_s", k.reconnect_s},
                     {"first_ack_s", k.first_ack_s},
                     {"restarted", k.restarted}});
    restart.push_back(k.restart_s);
    reconnect.push_back(k.reconnect_s);
    first_ack.push_back(k.first_ack_s);
    noticed.push_back(k.noticed_s);
    mid += k.mid_transfer;
  }
  auto stats = [](const Stats& s) {
    return json{{"n", s.n}, {"median", s.median}, {"max", s.max}};
  };
  json fds = json::object();
  for (const auto& [name, f] : r.fds) fds[name] = {{"before", f.first}, {"after", f.second}};
  return {{"part", r.part},
          {"kills_planned", r.kills_planned},
          {"kills", r.kills.size()},
          {"kills_mid_transfer", mid},
          {"objects", r.objects},
          {"puts_acked", r.puts_acked},
          {"bytes_acked", r.bytes_acked},
          {"puts_failed", r.puts_failed},
          {"keys_unacked", r.keys_unacked},
          {"unacked_absent", r.unacked_absent},
          {"unacked_whole", r.unacked_whole},
          {"failed_but_stored", r.failed_but_stored},
          {"failed_then_absent", r.failed_then_absent},
          {"lost", r.lost},
          {"corrupt", r.corrupt},
          {"stray", r.stray},
          {"listing_mismatch", r.listing_mismatch},
          {"temp_files", r.temp_files},
          {"orphan_meta", r.orphan_meta},
          {"multipart_uploads_left", r.multipart_left},
          {"objects_at_requester", r.objects_at_requester},
          {"endpoint_fds", fds},
          {"first_registration_s", r.first_registration_s},
          {"restart_s", stats(StatsOf(restart))},
          {"noticed_s", stats(StatsOf(noticed))},
          {"reconnect_s", stats(StatsOf(reconnect))},
          {"first_ack_s", stats(StatsOf(first_ack))},
          {"seconds", r.seconds},
          {"problems", r.problems},
          {"examples", r.examples},
          {"per_kill", kills},
          {"failed", r.failed()}};
}

void PrintTable(const std::vector<PartResult>& parts) {
  std::printf("\n%-6s %5s %4s %7s %9s %7s %7s %5s %7s %7s %5s %5s %5s %13s %13s %13s\n", "part",
              "kills", "mid", "acked", "acked MB", "failed", "unacked", "lost", "corrupt",
              "listing", "stray", "tmp", "meta", "restart s", "reconnect s", "first ack s");
  for (const auto& r : parts) {
    std::vector<double> restart, reconnect, first_ack;
    int mid = 0;
    for (const auto& k : r.kills) {
      restart.push_back(k.restart_s);
      reconnect.push_back(k.reconnect_s);
      first_ack.push_back(k.first_ack_s);
      mid += k.mid_transfer;
    }
    std::printf(
        "%-6s %5zu %4d %7llu %9.1f %7llu %7llu %5llu %7llu %7llu %5llu %5llu %5llu %13s %13s "
        "%13s%s\n",
        r.part.c_str(), r.kills.size(), mid, static_cast<unsigned long long>(r.puts_acked),
        r.bytes_acked / 1e6, static_cast<unsigned long long>(r.puts_failed),
        static_cast<unsigned long long>(r.keys_unacked), static_cast<unsigned long long>(r.lost),
        static_cast<unsigned long long>(r.corrupt),
        static_cast<unsigned long long>(r.listing_mismatch),
        static_cast<unsigned long long>(r.stray), static_cast<unsigned long long>(r.temp_files),
        static_cast<unsigned long long>(r.orphan_meta), Fmt(StatsOf(restart)).c_str(),
        Fmt(StatsOf(reconnect)).c_str(), Fmt(StatsOf(first_ack)).c_str(),
        r.failed() ? "  FAIL" : "");
  }
  std::printf(
      "(mid: kills with puts in flight and bytes arriving; acked: objects acknowledged; failed: "
      "put attempts that returned an error; unacked: keys whose every attempt failed; listing: "
      "LIST entries unlike the acknowledged PUTs; tmp: temporary files left in the directory; "
      "meta: s3d metadata files without their object; restart: SIGKILL to serving again; "
      "reconnect: relay serving to both endpoints registered; first ack: serving to the next "
      "acknowledged put; median/max)\n");
  for (const auto& r : parts) {
    if (r.part == "s3d") {
      std::printf("s3d: unacknowledged keys %llu absent, %llu whole; multipart uploads left %llu;",
                  static_cast<unsigned long long>(r.unacked_absent),
                  static_cast<unsigned long long>(r.unacked_whole),
                  static_cast<unsigned long long>(r.multipart_left));
    } else {
      std::printf("relay: unacknowledged keys %llu absent, %llu whole; objects kept at A %llu;",
                  static_cast<unsigned long long>(r.unacked_absent),
                  static_cast<unsigned long long>(r.unacked_whole),
                  static_cast<unsigned long long>(r.objects_at_requester));
      for (const auto& [name, f] : r.fds)
        std::printf(" endpoint %s fds %d -> %d;", name.c_str(), f.first, f.second);
    }
    std::printf(
        " read before a retry: %llu times a failed attempt stored whole, %llu times "
        "nothing stored\n",
        static_cast<unsigned long long>(r.failed_but_stored),
        static_cast<unsigned long long>(r.failed_then_absent));
    for (const auto& p : r.problems) std::printf("%s: problem: %s\n", r.part.c_str(), p.c_str());
    for (const auto& e : r.examples) std::printf("%s: %s\n", r.part.c_str(), e.c_str());
  }
}

int Usage(const std::string& why) {
  std::fprintf(stderr, "kill_restart: %s\n", why.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (k == "--keep") {
      a.keep = true;
      continue;
    }
    if (i + 1 >= argc) return Usage("missing value for " + k);
    const std::string v = argv[++i];
    try {
      if (k == "--xsilo")
        a.xsilo = v;
      else if (k == "--part")
        a.part = v;
      else if (k == "--s3d-kills")
        a.s3d_kills = std::stoi(v);
      else if (k == "--relay-kills")
        a.relay_kills = std::stoi(v);
      else if (k == "--writers")
        a.writers = std::stoi(v);
      else if (k == "--seed") {
        a.seed = std::stoull(v);
        a.seed_given = true;
      } else if (k == "--kill-bytes-min")
        a.kill_bytes_min = ParseBytes(v);
      else if (k == "--kill-bytes-max")
        a.kill_bytes_max = ParseBytes(v);
      else if (k == "--down-ms")
        a.down_ms = std::stoll(v);
      else if (k == "--work-dir")
        a.work_dir = v;
      else if (k == "--json")
        a.json = v;
      else
        return Usage("unknown option " + k);
    } catch (const std::exception&) {
      return Usage("bad value for " + k + ": " + v);
    }
  }
  if (a.part != "s3d" && a.part != "relay" && a.part != "both")
    return Usage("--part is s3d, relay or both");
  if (a.writers < 1 || a.down_ms < 0 || a.s3d_kills < 0 || a.relay_kills < 0 ||
      a.kill_bytes_min > a.kill_bytes_max)
    return Usage("need --writers >= 1, kills >= 0, --kill-bytes-min <= --kill-bytes-max");
  if (a.xsilo.empty()) {
    // Beside this program in a build tree: build/bench/ and build/tools/xsilo/.
    a.xsilo = (fs::path(bench::SelfExe()).parent_path().parent_path() / "tools" / "xsilo" / "xsilo")
                  .string();
  }
  if (::access(a.xsilo.c_str(), X_OK) != 0)
    return Usage("no xsilo executable at " + a.xsilo +
                 " (build the xsilo target, or --xsilo PATH)");
  if (!a.seed_given) a.seed = std::random_device{}();
  std::printf(
      "kill_restart: seed %llu, %d writers, kills armed after %.1f-%.1f MiB, down %lld ms, "
      "xsilo %s\n",
      static_cast<unsigned long long>(a.seed), a.writers, a.kill_bytes_min / double(kMiB),
      a.kill_bytes_max / double(kMiB), static_cast<long long>(a.down_ms), a.xsilo.c_str());
  std::signal(SIGPIPE, SIG_IGN);
  {
    PortTraffic probe(0);
    uint64_t ignored = 0;
    if (!probe.ok() || !probe.Sample(&ignored))
      return Usage("NETLINK_INET_DIAG (sock_diag) does not answer: cannot see transfers in flight");
  }

  std::string work = a.work_dir;
  if (work.empty()) {
    char tmpl[] = "/tmp/kill_restart.XXXXXX";
    if (!mkdtemp(tmpl)) return Usage("cannot create a work directory under /tmp");
    work = tmpl;
  } else {
    fs::create_directories(work);
  }
  std::printf("work directory %s\n", work.c_str());
  std::mt19937_64 rng(a.seed);
  std::vector<PartResult> parts;
  if (a.part != "relay") {
    std::printf("s3d: %d kills\n", a.s3d_kills);
    std::mt19937_64 part_rng(rng());
    parts.push_back(RunS3d(a, work, part_rng));
  } else {
    rng();
  }
  if (a.part != "s3d") {
    std::printf("relay: %d kills\n", a.relay_kills);
    std::mt19937_64 part_rng(rng());
    parts.push_back(RunRelay(a, work, part_rng));
  }
  PrintTable(parts);
  bool failed = false;
  json out = {{"benchmark", "kill_restart"},
              {"seed", a.seed},
              {"writers", a.writers},
              {"kill_bytes_min", a.kill_bytes_min},
              {"kill_bytes_max", a.kill_bytes_max},
              {"down_ms", a.down_ms},
              {"parts", json::array()}};
  for (const auto& r : parts) {
    out["parts"].push_back(ToJson(r));
    failed = failed || r.failed();
  }
  out["failed"] = failed;
  std::ofstream(a.json) << out.dump(2) << "\n";
  if (!failed && !a.keep) {
    std::error_code ec;
    fs::remove_all(work, ec);
  } else {
    std::printf("kept %s (logs, directories)\n", work.c_str());
  }
  std::printf("wrote %s: %s\n", a.json.c_str(), failed ? "FAILED" : "ok");
  return failed ? 1 : 0;
}
