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

}  // namespace xsilo
