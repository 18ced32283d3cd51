#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <future>
#include <string>
#include <thread>

#include "xsilo/transport/transport.h"

namespace xsilo {
namespace {

using namespace std::chrono_literals;

Message Numbered(int64_t n) {
  Message m;
  m.round = n;
  return m;
}

TEST(Inbox, FifoAndTimeout) {
  Inbox inbox(4);
  ASSERT_TRUE(inbox.Push(Numbered(1)).ok());
  ASSERT_TRUE(inbox.Push(Numbered(2)).ok());
  EXPECT_EQ(inbox.Pop(1s)->round, 1);
  EXPECT_EQ(inbox.Pop(1s)->round, 2);
  EXPECT_EQ(inbox.Pop(10ms).status().code(), StatusCode::kTimeout);
}

// Whether thread `tid` of this process sleeps in the kernel (state S of
// /proc/self/task/<tid>/stat). A runnable thread shows R however long it
// waits for a CPU, so a thread inside Push shows S only once it is waiting
// for room in the queue.
bool Sleeping(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  std::getline(stat, line);
  const size_t name_end = line.rfind(')');
  return name_end != std::string::npos && name_end + 2 < line.size() && line[name_end + 2] == 'S';
}

// Waits (polling, up to 30 s) until thread `tid`, which is calling Push,
// sleeps in it; false if it returned (`returned`) or never slept.
bool BlockedInPush(pid_t tid, const std::atomic<bool>& returned) {
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (!returned.load() && std::chrono::steady_clock::now() < deadline) {
    if (Sleeping(tid)) return !returned.load();
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

TEST(Inbox, FullQueuePushesBackUntilPopped) {
  Inbox inbox(1);
  ASSERT_TRUE(inbox.Push(Numbered(1)).ok());
  std::atomic<bool> pushed{false};
  std::promise<pid_t> pusher_tid;
  std::thread t([&] {
    pusher_tid.set_value(gettid());
    EXPECT_TRUE(inbox.Push(Numbered(2)).ok());
    pushed = true;
  });
  EXPECT_TRUE(BlockedInPush(pusher_tid.get_future().get(), pushed))
      << "a push into a full queue did not block";
  EXPECT_FALSE(pushed.load());
  EXPECT_EQ(inbox.Pop(1s)->round, 1);
  t.join();
  EXPECT_TRUE(pushed.load());
}

TEST(Inbox, AbandonedPushGivesUp) {
  Inbox inbox(1);
  ASSERT_TRUE(inbox.Push(Numbered(1)).ok());
  std::atomic<bool> abandon{false};
  std::thread t([&] {
    EXPECT_EQ(inbox.Push(Numbered(2), [&] { return abandon.load(); }).code(),
              StatusCode::kCancelled);
  });
  abandon = true;
  t.join();
}

TEST(Inbox, CloseWakesWaitersAndDrains) {
  Inbox inbox(1);
  ASSERT_TRUE(inbox.Push(Numbered(1)).ok());
  std::atomic<bool> returned{false};
  std::promise<pid_t> pusher_tid;
  std::thread pusher([&] {
    pusher_tid.set_value(gettid());
    EXPECT_EQ(inbox.Push(Numbered(2)).code(), StatusCode::kCancelled);
    returned = true;
  });
  EXPECT_TRUE(BlockedInPush(pusher_tid.get_future().get(), returned))
      << "a push into a full queue did not block";
  inbox.Close();
  pusher.join();
  EXPECT_EQ(inbox.Pop(1s)->round, 1);  // queued messages stay readable
  EXPECT_EQ(inbox.Pop(1s).status().code(), StatusCode::kCancelled);
}

TEST(Inbox, HandlerTakesBacklogThenNewMessages) {
  Inbox inbox(4);
  ASSERT_TRUE(inbox.Push(Numbered(1)).ok());
  std::vector<int64_t> seen;
  inbox.SetHandler([&](Message m) { seen.push_back(m.round); });
  ASSERT_TRUE(inbox.Push(Numbered(2)).ok());
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(inbox.size(), 0u);
}

// A forwarder takes every message on the pushing thread with the pusher's
// abandon test, and its outcome is the push's.
TEST(Inbox, ForwarderTakesMessagesWithThePushersAbandonTest) {
  Inbox inbox(4);
  std::vector<int64_t> seen;
  bool saw_abandon = false;
  inbox.SetForwarder([&](Message m, const std::function<bool()>& abandon) {
    seen.push_back(m.round);
    saw_abandon = abandon && abandon();
    return m.round == 2 ? Cancelled("refused") : Status::OK();
  });
  EXPECT_TRUE(inbox.Push(Numbered(1)).ok());
  EXPECT_EQ(inbox.Push(Numbered(2), [] { return true; }).code(), StatusCode::kCancelled);
  EXPECT_TRUE(saw_abandon);
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(inbox.size(), 0u);
}

}  // namespace
}  // namespace xsilo
