#include <gtest/gtest.h>

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

TEST(Inbox, FullQueuePushesBackUntilPopped) {
  Inbox inbox(1);
  ASSERT_TRUE(inbox.Push(Numbered(1)).ok());
  std::atomic<bool> pushed{false};
  std::thread t([&] {
    EXPECT_TRUE(inbox.Push(Numbered(2)).ok());
    pushed = true;
  });
  std::this_thread::sleep_for(30ms);
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
  std::thread pusher([&] { EXPECT_EQ(inbox.Push(Numbered(2)).code(), StatusCode::kCancelled); });
  std::this_thread::sleep_for(10ms);
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
