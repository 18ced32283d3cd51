#include "xsilo/transport/transport.h"

#include <algorithm>
#include <atomic>
#include <charconv>
#include <vector>

namespace xsilo {

Status Transport::CheckPeer(int32_t peer) const {
  if (peer < 0 || peer >= options_.world_size) {
    return InvalidArgument("peer " + std::to_string(peer) + " outside world of " +
                           std::to_string(options_.world_size));
  }
  if (peer == options_.rank) return InvalidArgument("cannot send to self");
  return Status::OK();
}

std::function<SendCallback(int32_t)> Transport::JoinBroadcast(size_t count, SendCallback done) {
  struct Join {
    std::mutex mu;
    size_t remaining;
    Status first_error;
    SendCallback done;
  };
  auto join = std::make_shared<Join>();
  join->remaining = count;
  join->done = std::move(done);
  return [join](int32_t peer) -> SendCallback {
    return [join, peer](const Status& s) {
      SendCallback finish;
      Status result;
      {
        std::lock_guard<std::mutex> lock(join->mu);
        if (!s.ok() && join->first_error.ok()) {
          join->first_error = s.WithContext("peer " + std::to_string(peer));
        }
        if (--join->remaining > 0) return;
        finish = std::move(join->done);
        result = join->first_error;
      }
      finish(result);
    };
  };
}

void Transport::BroadcastAsync(std::vector<int32_t> peers, Message message, SendCallback done) {
  if (peers.empty()) {
    done(Status::OK());
    return;
  }
  auto joined = JoinBroadcast(peers.size(), std::move(done));
  // Copies of a Message share their tensor Buffers: no payload bytes move.
  for (int32_t peer : peers) SendAsync(peer, message, joined(peer));
}

namespace {

// Waits for a callback-completed operation, tolerating the callback firing
// after the waiter gave up.
struct Waiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  Status status;

  SendCallback Callback(const std::shared_ptr<Waiter>& self) {
    return [self](const Status& s) {
      std::lock_guard<std::mutex> lock(self->mu);
      self->status = s;
      self->done = true;
      self->cv.notify_all();
    };
  }
  Status Wait(Duration timeout) {
    std::unique_lock<std::mutex> lock(mu);
    if (!cv.wait_for(lock, timeout, [&] { return done; })) {
      return Timeout("send not completed within " + std::to_string(timeout.count()) + " ms");
    }
    return status;
  }
};

}  // namespace

Status Transport::Send(int32_t peer, Message message, Duration timeout) {
  auto w = std::make_shared<Waiter>();
  SendAsync(peer, std::move(message), w->Callback(w));
  return w->Wait(timeout);
}

Status Transport::Broadcast(std::vector<int32_t> peers, Message message, Duration timeout) {
  auto w = std::make_shared<Waiter>();
  BroadcastAsync(std::move(peers), std::move(message), w->Callback(w));
  return w->Wait(timeout);
}

Result<int64_t> BackendInt(const TransportOptions& options, const std::string& key,
                           int64_t fallback) {
  auto it = options.backend.find(key);
  if (it == options.backend.end()) return fallback;
  const std::string& s = it->second;
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || ptr != s.data() + s.size()) {
    return InvalidArgument("backend option " + key + "='" + s + "' is not an integer");
  }
  return v;
}

std::string BackendString(const TransportOptions& options, const std::string& key,
                          std::string fallback) {
  auto it = options.backend.find(key);
  return it == options.backend.end() ? std::move(fallback) : it->second;
}

namespace {

// Levenshtein distance of two short keys.
size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

// The key of `known` nearest to `key`, when close enough to be a slip;
// else empty.
std::string NearestKey(const std::string& key, const std::vector<std::string>& known) {
  std::string best;
  size_t best_distance = 0;
  for (const auto& k : known) {
    const size_t d = EditDistance(key, k);
    if (best.empty() || d < best_distance) {
      best = k;
      best_distance = d;
    }
  }
  // Close enough to be a slip: at most a third of the key's letters.
  return !best.empty() && best_distance * 3 <= std::max(key.size(), best.size()) ? best : "";
}

}  // namespace

// The error names the known key nearest to the unknown one, when one is
// close enough to be a slip.
Status CheckBackendKeys(const TransportOptions& options, const std::vector<std::string>& known) {
  for (const auto& [k, v] : options.backend) {
    if (std::find(known.begin(), known.end(), k) == known.end()) {
      std::string list;
      for (const auto& n : known) list += (list.empty() ? "" : ", ") + n;
      const std::string nearest = NearestKey(k, known);
      return InvalidArgument("unknown backend option '" + k + "'" +
                             (nearest.empty() ? "" : " (did you mean '" + nearest + "'?)") +
                             " (known: " + (list.empty() ? "none" : list) + ")");
    }
  }
  return Status::OK();
}

}  // namespace xsilo
