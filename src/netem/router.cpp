// The netem router. Design (see docs/netem.md):
//  - Every packet read from a site's TUN device is an IPv4 packet whose
//    destination 198.18.0.<k+1> names site k; anything else is dropped.
//  - A directed link is a serializer at `rate` followed by a delay line. The
//    serializer is a token bucket one packet deep: a packet leaves it at
//    max(now, previous departure) + size / rate, so bytes waiting in it are
//    (departure - now) * rate, and a packet that would exceed the queue bound
//    is dropped (drop-tail). The packet is then delivered `delay` (+ jitter)
//    later. Delivery times on one link never decrease, so each link's delay
//    line is a FIFO ring and the next event is the earliest head among the
//    links that hold packets (at most sites^2 of them).
//  - SIGUSR1 (on the signalfd) makes the router call RouterConfig::reload
//    and switch every link to its new shape at once. Packets already in a
//    link keep their departure and delivery times; later packets queue
//    behind them at the new rate and get the new delay, but are never
//    delivered before a packet ahead of them (so a shorter delay takes
//    effect once the older packets are out).
//  - Packet memory comes from two slot pools (MTU-sized and small) that grow
//    in chunks and are reused: no allocation per packet in steady state.
//    Packets are read into a spare large slot; small ones (ACKs) are copied
//    into a small slot so the large slot is reused at once.
#include "router.h"
#include "xsilo/core/log.h"

#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <memory>

namespace xsilo::netem::internal {

namespace {

constinit LogComponent kLog("netem");

constexpr uint32_t kSmallSlot = 2048;
constexpr int kReadBatch = 64;
constexpr int64_t kStatsIntervalNs = 1'000'000'000;
constexpr uint32_t kFirstSiteAddress = 0xC6120001u;  // 198.18.0.1

int64_t NowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return int64_t{ts.tv_sec} * 1'000'000'000 + ts.tv_nsec;
}

class SlotPool {
 public:
  SlotPool(size_t slot_bytes, size_t per_chunk) : slot_bytes_(slot_bytes), per_chunk_(per_chunk) {}

  uint8_t* Get() {
    if (free_.empty()) Grow();
    uint8_t* p = free_.back();
    free_.pop_back();
    return p;
  }
  void Put(uint8_t* p) { free_.push_back(p); }

 private:
  void Grow() {
    chunks_.emplace_back(new uint8_t[slot_bytes_ * per_chunk_]);
    free_.reserve(free_.size() + per_chunk_ * chunks_.size());
    for (size_t i = 0; i < per_chunk_; ++i) free_.push_back(chunks_.back().get() + i * slot_bytes_);
  }

  size_t slot_bytes_;
  size_t per_chunk_;
  std::vector<std::unique_ptr<uint8_t[]>> chunks_;
  std::vector<uint8_t*> free_;
};

struct Queued {
  int64_t deliver_ns;
  uint8_t* data;
  uint32_t len;
  bool small;
};

// A FIFO ring that doubles when full.
class Fifo {
 public:
  bool empty() const { return head_ == tail_; }
  const Queued& front() const { return ring_[head_ & mask_]; }
  void pop() { ++head_; }
  void push(const Queued& q) {
    if (tail_ - head_ == ring_.size()) Grow();
    ring_[tail_ & mask_] = q;
    ++tail_;
  }

 private:
  void Grow() {
    std::vector<Queued> bigger(std::max<size_t>(64, ring_.size() * 2));
    size_t n = tail_ - head_;
    for (size_t i = 0; i < n; ++i) bigger[i] = ring_[(head_ + i) & mask_];
    ring_.swap(bigger);
    mask_ = ring_.size() - 1;
    head_ = 0;
    tail_ = n;
  }

  std::vector<Queued> ring_;
  size_t mask_ = 0;
  size_t head_ = 0;
  size_t tail_ = 0;
};

struct Link {
  int from = 0;
  int to = 0;
  double ns_per_byte = 0;  // 0 = unlimited rate
  int64_t delay_ns = 0;
  int64_t jitter_ns = 0;
  double loss = 0;
  double queue_limit = 0;  // bytes
  double free_at_ns = 0;   // when the serializer has sent what it holds
  int64_t last_deliver_ns = 0;
  bool active = false;  // in the router's active list
  Fifo fifo;
  LinkStats stats;
};

// xorshift64*: loss and jitter need speed, not quality.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed ? seed : 1) {}
  double Uniform() {  // [0, 1)
    s_ ^= s_ >> 12;
    s_ ^= s_ << 25;
    s_ ^= s_ >> 27;
    return static_cast<double>((s_ * 0x2545F4914F6CDD1Dull) >> 11) * 0x1.0p-53;
  }

 private:
  uint64_t s_;
};

class Router {
 public:
  explicit Router(const RouterConfig& c)
      : config_(c),
        sites_(static_cast<int>(c.tun_fds.size())),
        large_(c.mtu + 64, 64),
        small_(kSmallSlot, 1024),
        rng_(c.seed) {
    links_.resize(static_cast<size_t>(sites_) * sites_);
    for (int f = 0; f < sites_; ++f) {
      for (int t = 0; t < sites_; ++t) {
        Link& l = links_[f * sites_ + t];
        l.from = f;
        l.to = t;
        l.stats.from = f;
        l.stats.to = t;
      }
    }
    ApplyShapes(c.links);
    spare_ = large_.Get();
  }

  Status Run() {
    int ep = epoll_create1(EPOLL_CLOEXEC);
    if (ep < 0) return Internal(std::string("epoll_create1: ") + strerror(errno));
    for (int i = 0; i <= sites_; ++i) {
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<uint32_t>(i);  // sites_ = the signal descriptor
      int fd = i < sites_ ? config_.tun_fds[i] : config_.signal_fd;
      if (fd < 0) continue;
      if (epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) {
        close(ep);
        return Internal(std::string("epoll_ctl: ") + strerror(errno));
      }
    }
    int64_t next_stats = NowNs() + kStatsIntervalNs;
    epoll_event events[64];
    bool running = true;
    while (running) {
      int64_t now = NowNs();
      int64_t next = DeliverDue(now);
      if (now >= next_stats) {
        WriteStats();
        next_stats = now + kStatsIntervalNs;
      }
      next = std::min(next, next_stats);
      int64_t wait_ns = std::max<int64_t>(0, next - NowNs());
      timespec timeout{static_cast<time_t>(wait_ns / 1'000'000'000),
                       static_cast<long>(wait_ns % 1'000'000'000)};
      int n = epoll_pwait2(ep, events, 64, &timeout, nullptr);
      if (n < 0) {
        if (errno == EINTR) continue;
        close(ep);
        return Internal(std::string("epoll_pwait2: ") + strerror(errno));
      }
      for (int i = 0; i < n; ++i) {
        int site = static_cast<int>(events[i].data.u32);
        if (site == sites_) {
          running = HandleSignals();
        } else {
          ReadSite(site);
        }
      }
    }
    WriteStats();
    close(ep);
    return Status::OK();
  }

 private:
  // Only the shape changes: a link's serializer state (free_at_ns), delivery
  // order (last_deliver_ns), queued packets and counters carry over.
  void ApplyShapes(const std::vector<std::vector<LinkShape>>& shapes) {
    for (Link& l : links_) {
      const LinkShape& s = shapes[l.from][l.to];
      l.ns_per_byte = s.rate_MBps > 0 ? 1e9 / (s.rate_MBps * 1e6) : 0;
      l.delay_ns = static_cast<int64_t>(std::llround(s.delay_ms * 1e6));
      l.jitter_ns = static_cast<int64_t>(std::llround(s.jitter_ms * 1e6));
      l.loss = s.loss;
      l.queue_limit =
          static_cast<double>(s.queue_bytes ? s.queue_bytes : DefaultQueueBytes(s, config_.mtu));
    }
  }

  // Drains the signalfd; false when a stop signal arrived.
  bool HandleSignals() {
    bool reload = false;
    signalfd_siginfo info;
    while (read(config_.signal_fd, &info, sizeof info) == sizeof info) {
      if (info.ssi_signo != SIGUSR1) return false;
      reload = true;
    }
    if (reload) Reload();
    return true;
  }

  void Reload() {
    if (!config_.reload) return;
    auto r = config_.reload();
    if (!r.ok()) {
      XSILO_LOG(kLog, kWarn, "router: links not changed: " << r.status().ToString());
      return;
    }
    const size_t n = static_cast<size_t>(sites_);
    bool square = r->links.size() == n;
    for (const auto& row : r->links) square = square && row.size() == n;
    if (!square) {
      XSILO_LOG(kLog, kWarn, "router: links not changed: not " << n << " x " << n);
      return;
    }
    ApplyShapes(r->links);
    links_version_ = r->version;
    XSILO_LOG(kLog, kInfo, "router: links version " << links_version_ << " applied");
    WriteStats();  // SetLinks waits for this version to appear
  }

  // Delivers every packet due by `now`; returns the next delivery time.
  int64_t DeliverDue(int64_t now) {
    int64_t next = INT64_MAX;
    size_t keep = 0;
    for (size_t i = 0; i < active_.size(); ++i) {
      Link* l = active_[i];
      while (!l->fifo.empty() && l->fifo.front().deliver_ns <= now) {
        const Queued& q = l->fifo.front();
        ssize_t w = write(config_.tun_fds[l->to], q.data, q.len);
        if (w == static_cast<ssize_t>(q.len)) {
          ++l->stats.packets;
          l->stats.bytes += q.len;
        } else {
          ++l->stats.dropped_queue;  // the destination device refused it
        }
        (q.small ? small_ : large_).Put(q.data);
        l->fifo.pop();
      }
      if (l->fifo.empty()) {
        l->active = false;
      } else {
        next = std::min(next, l->fifo.front().deliver_ns);
        active_[keep++] = l;
      }
    }
    active_.resize(keep);
    return next;
  }

  void ReadSite(int site) {
    const int fd = config_.tun_fds[site];
    for (int i = 0; i < kReadBatch; ++i) {
      ssize_t n = read(fd, spare_, config_.mtu + 64);
      if (n <= 0) return;  // EAGAIN (drained) or the device went away
      Enqueue(site, static_cast<uint32_t>(n));
    }
  }

  void Enqueue(int from, uint32_t len) {
    if (len < 20 || (spare_[0] >> 4) != 4) {
      ++unroutable_;
      return;
    }
    uint32_t dst = (uint32_t{spare_[16]} << 24) | (uint32_t{spare_[17]} << 16) |
                   (uint32_t{spare_[18]} << 8) | spare_[19];
    uint32_t to = dst - kFirstSiteAddress;
    if (to >= static_cast<uint32_t>(sites_) || static_cast<int>(to) == from) {
      ++unroutable_;
      return;
    }
    Link& l = links_[from * sites_ + to];
    if (l.loss > 0 && rng_.Uniform() < l.loss) {
      ++l.stats.dropped_loss;
      return;
    }
    const int64_t now = NowNs();
    double depart = static_cast<double>(now);
    if (l.ns_per_byte > 0) {
      double start = std::max(depart, l.free_at_ns);
      double backlog = (start - depart) / l.ns_per_byte;
      if (backlog > 0 && backlog + len > l.queue_limit) {
        ++l.stats.dropped_queue;
        return;
      }
      l.free_at_ns = start + len * l.ns_per_byte;
      depart = l.free_at_ns;
    }
    int64_t deliver = static_cast<int64_t>(depart) + l.delay_ns;
    if (l.jitter_ns > 0) {
      deliver += static_cast<int64_t>((2 * rng_.Uniform() - 1) * static_cast<double>(l.jitter_ns));
    }
    deliver = std::max(deliver, l.last_deliver_ns);  // never reorder
    l.last_deliver_ns = deliver;

    Queued q{deliver, spare_, len, false};
    if (len <= kSmallSlot) {
      q.data = small_.Get();
      q.small = true;
      memcpy(q.data, spare_, len);
    } else {
      spare_ = large_.Get();
    }
    l.fifo.push(q);
    if (!l.active) {
      l.active = true;
      active_.push_back(&l);
    }
  }

  void WriteStats() {
    if (config_.stats_path.empty()) return;
    std::string tmp = config_.stats_path + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f) return;
    fprintf(f, "{\"links_version\": %llu, \"unroutable\": %llu, \"links\": [",
            static_cast<unsigned long long>(links_version_),
            static_cast<unsigned long long>(unroutable_));
    bool first = true;
    for (const Link& l : links_) {
      if (l.from == l.to) continue;
      const LinkStats& s = l.stats;
      fprintf(f,
              "%s\n{\"from\": %d, \"to\": %d, \"packets\": %llu, \"bytes\": %llu, "
              "\"dropped_queue\": %llu, \"dropped_loss\": %llu}",
              first ? "" : ",", s.from, s.to, static_cast<unsigned long long>(s.packets),
              static_cast<unsigned long long>(s.bytes),
              static_cast<unsigned long long>(s.dropped_queue),
              static_cast<unsigned long long>(s.dropped_loss));
      first = false;
    }
    fprintf(f, "\n]}\n");
    fclose(f);
    rename(tmp.c_str(), config_.stats_path.c_str());
  }

  const RouterConfig& config_;
  int sites_;
  std::vector<Link> links_;
  std::vector<Link*> active_;
  SlotPool large_;
  SlotPool small_;
  uint8_t* spare_ = nullptr;
  Rng rng_;
  uint64_t unroutable_ = 0;
  uint64_t links_version_ = 0;
};

}  // namespace

Status RunRouter(const RouterConfig& config) {
  const size_t n = config.tun_fds.size();
  if (config.links.size() != n) return InvalidArgument("links must be sites x sites");
  for (const auto& row : config.links) {
    if (row.size() != n) return InvalidArgument("links must be sites x sites");
  }
  auto router = std::make_unique<Router>(config);
  return router->Run();
}

}  // namespace xsilo::netem::internal
