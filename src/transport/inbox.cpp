#include "xsilo/transport/inbox.h"

#include <utility>

namespace xsilo {

void Inbox::SetHandler(MessageHandler handler) {
  std::deque<Message> backlog;
  MessageHandler h;
  {
    std::lock_guard<std::mutex> lock(mu_);
    handler_ = std::move(handler);
    if (!handler_) return;
    backlog.swap(queue_);
    h = handler_;
  }
  not_full_.notify_all();
  for (auto& m : backlog) h(std::move(m));
}

void Inbox::SetForwarder(MessageForwarder forwarder) {
  std::lock_guard<std::mutex> lock(mu_);
  forwarder_ = std::move(forwarder);
}

Status Inbox::Push(Message message, const std::function<bool()>& abandon) {
  MessageHandler h;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (forwarder_) {
      MessageForwarder f = forwarder_;
      lock.unlock();
      return f(std::move(message), abandon);
    }
    auto ready = [&] { return closed_ || handler_ || queue_.size() < capacity_; };
    if (abandon) {
      // The sender may stop while we wait; poll its flag in short slices.
      while (!not_full_.wait_for(lock, std::chrono::milliseconds(20), ready)) {
        if (abandon()) return Cancelled("sender stopped while the receiver's queue was full");
      }
    } else {
      not_full_.wait(lock, ready);
    }
    if (closed_) return Cancelled("receiver stopped");
    if (!handler_) {
      queue_.push_back(std::move(message));
      not_empty_.notify_one();
      return Status::OK();
    }
    h = handler_;
  }
  h(std::move(message));
  return Status::OK();
}

Result<Message> Inbox::Pop(Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  if (!not_empty_.wait_for(lock, timeout, [&] { return closed_ || !queue_.empty(); })) {
    return Timeout("no message within " + std::to_string(timeout.count()) + " ms");
  }
  if (queue_.empty()) return Cancelled("transport stopped");
  Message m = std::move(queue_.front());
  queue_.pop_front();
  not_full_.notify_one();
  return m;
}

void Inbox::Close() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  not_empty_.notify_all();
  not_full_.notify_all();
}

size_t Inbox::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return queue_.size();
}

}  // namespace xsilo
