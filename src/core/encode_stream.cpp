#include "xsilo/core/encode_stream.h"

#include <algorithm>

namespace xsilo {

void EncodeStream::SetInputBytes(uint64_t total) {
  std::lock_guard<std::mutex> lock(mu_);
  input_total_ = total;
}

void EncodeStream::Append(Buffer bytes, uint64_t input_bytes) {
  if (bytes.empty()) return;
  uint64_t ready;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (abandoned_ || finished_) return;
    input_done_ += input_bytes;
    starts_.push_back(ready_);
    ready_ += bytes.size();
    ready = ready_;
    pieces_.push_back(std::move(bytes));
  }
  cv_.notify_all();
  if (on_append) on_append(ready);
}

void EncodeStream::Abandon() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    abandoned_ = true;
  }
  cv_.notify_all();
}

void EncodeStream::Finish(Result<Message> message) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finished_) return;
    finished_ = true;
    message_.emplace(std::move(message));
  }
  cv_.notify_all();
}

EncodeStream::State EncodeStream::Now() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {ready_, abandoned_, finished_};
}

uint64_t EncodeStream::Estimate() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (finished_) return ready_;
  if (input_done_ == 0 || input_total_ <= input_done_) return std::max(expected_bytes_, ready_);
  const double scaled = double(ready_) * double(input_total_) / double(input_done_);
  return std::max(ready_, static_cast<uint64_t>(scaled));
}

EncodeStream::State EncodeStream::WaitBeyond(uint64_t have) const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return ready_ > have || abandoned_ || finished_; });
  return {ready_, abandoned_, finished_};
}

Result<Message> EncodeStream::TakeMessage() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return finished_; });
  if (!message_) return FailedPrecondition("the stream's message was taken already");
  Result<Message> out = std::move(*message_);
  message_.reset();
  return out;
}

GatherList EncodeStream::Range(uint64_t offset, uint64_t length) const {
  std::lock_guard<std::mutex> lock(mu_);
  GatherList out;
  if (length == 0) return out;
  // The piece that holds `offset`, then on until `length` is covered.
  size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), offset) -
                                 starts_.begin()) -
             1;
  for (; i < pieces_.size() && length > 0; ++i) {
    const uint64_t skip = offset - starts_[i];
    const uint64_t n = std::min(pieces_[i].size() - skip, length);
    out.Append(pieces_[i].SliceUnchecked(skip, n));
    offset += n;
    length -= n;
  }
  return out;
}

bool EncodeStream::Holds(const std::vector<const Tensor*>& order) const {
  std::lock_guard<std::mutex> lock(mu_);
  if (abandoned_) return false;
  size_t i = 0;  // the next piece
  for (const Tensor* t : order) {
    const uint64_t n = t->nbytes();
    if (n == 0) continue;  // appends nothing
    // The tensor's bytes: pieces of the same storage, one after another.
    const uint8_t* want = t->data.data();
    uint64_t covered = 0;
    while (covered < n) {
      if (i >= pieces_.size()) return false;
      const Buffer& p = pieces_[i];
      if (p.data() != want + covered || !p.SharesStorageWith(t->data)) return false;
      covered += p.size();
      ++i;
    }
    if (covered != n) return false;
  }
  return i == pieces_.size();
}

}  // namespace xsilo
