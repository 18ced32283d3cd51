#include <algorithm>
#include <thread>

#include "store/future/notifier.h"
#include "xsilo/store/store.h"

namespace xsilo {

Status Store::WaitForKey(const Key& key, std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  // A notified waiter still re-checks at least this often, so a setter that
  // bypassed this Store (and sent no signal) is seen too.
  constexpr std::chrono::milliseconds kNotifySlice{1000};
  constexpr std::chrono::milliseconds kMaxBackoff{500};
  XSILO_RETURN_IF_ERROR(CheckOpen());
  const auto deadline = Clock::now() + timeout;
  std::chrono::milliseconds backoff{1};
  bool notify = notifier_ != nullptr;
  for (;;) {
    XSILO_ASSIGN_OR_RETURN(bool exists, connector_->Exists(key));
    if (exists) return Status::OK();
    auto now = Clock::now();
    if (now >= deadline) {
      return Timeout("key " + key.ToJson() + " was not set in store '" + name_ + "' within " +
                     std::to_string(timeout.count()) + " ms");
    }
    auto remaining = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
    if (notify) {
      auto woke = notifier_->Wait(key, std::min(remaining, kNotifySlice));
      if (woke.ok()) continue;
      notify = false;  // e.g. this member cannot notify: poll from now on
    }
    std::this_thread::sleep_for(std::min(backoff, remaining));
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

}  // namespace xsilo
