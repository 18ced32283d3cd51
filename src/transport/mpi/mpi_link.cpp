// A link's queue of received messages, filled by the engine thread and
// read by the transport's delivery thread.
#include "transport/mpi/mpi_engine_internal.h"

namespace xsilo::mpi {

Link::Link(LinkConfig config) : config_(std::move(config)) {}
Link::~Link() = default;

Result<Received> Link::NextReceived() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return closed_ || !ready_.empty(); });
  if (closed_) return Cancelled("transport stopped");
  Received r = std::move(ready_.front());
  ready_.pop_front();
  return r;
}

void Link::PushReceived(Received r) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    ready_.push_back(std::move(r));
  }
  cv_.notify_one();
}

size_t Link::ReadyCount() {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_.size();
}

void Link::CloseReady() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    ready_.clear();
  }
  cv_.notify_all();
}

}  // namespace xsilo::mpi
