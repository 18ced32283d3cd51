// Owned and borrowed proxies, context and lease lifetimes.
#include <gtest/gtest.h>

#include <thread>
#include <type_traits>

#include "store/store_test_util.h"
#include "xsilo/store/lifetime.h"

namespace xsilo {
namespace {

using testing::CountingConnector;
using Clock = std::chrono::steady_clock;

static_assert(!std::is_copy_constructible_v<OwnedProxy<std::string>>);
static_assert(!std::is_copy_assignable_v<OwnedProxy<std::string>>);
static_assert(std::is_nothrow_move_constructible_v<OwnedProxy<std::string>>);
static_assert(std::is_copy_constructible_v<BorrowedProxy<std::string>>);

std::shared_ptr<Store> MemoryStore(CountingConnector** counter = nullptr) {
  auto inner = MakeConnector(testing::FreshConnectorConfig("memory"));
  auto counting = std::make_unique<CountingConnector>(std::move(inner).value());
  if (counter) *counter = counting.get();
  return *Store::Create("l-" + RandomObjectId().substr(0, 8), std::move(counting),
                        {.cache_bytes = 0});
}

TEST(OwnedProxy, EvictsWhenItGoesOutOfScope) {
  auto store = MemoryStore();
  Key key;
  {
    auto owned = store->MakeOwnedProxy(std::string("mine"));
    ASSERT_TRUE(owned.ok());
    key = owned->key();
    EXPECT_TRUE(owned->owns());
    EXPECT_EQ(**owned->Get(), "mine");
    EXPECT_TRUE(*store->Exists(key));
  }
  EXPECT_FALSE(*store->Exists(key));
}

TEST(OwnedProxy, MovesTransferOwnership) {
  auto store = MemoryStore();
  std::optional<OwnedProxy<std::string>> outer;
  Key key;
  {
    auto owned = store->MakeOwnedProxy(std::string("moved"));
    ASSERT_TRUE(owned.ok());
    key = owned->key();
    OwnedProxy<std::string> inner = std::move(owned).value();
    outer.emplace(std::move(inner));
    EXPECT_FALSE(inner.owns());  // NOLINT(bugprone-use-after-move): checking moved-from state
  }
  EXPECT_TRUE(*store->Exists(key)) << "a moved-from owner must not evict";
  // Move-assigning over an owner evicts what it owned.
  auto other = store->MakeOwnedProxy(std::string("other"));
  ASSERT_TRUE(other.ok());
  Key other_key = other->key();
  *outer = std::move(other).value();
  EXPECT_FALSE(*store->Exists(key));
  EXPECT_TRUE(*store->Exists(other_key));
  outer.reset();
  EXPECT_FALSE(*store->Exists(other_key));
}

TEST(OwnedProxy, ReleaseGivesUpOwnership) {
  auto store = MemoryStore();
  Proxy<std::string> plain([] { return Result<std::string>(std::string()); });
  {
    auto owned = store->MakeOwnedProxy(std::string("handed over"));
    ASSERT_TRUE(owned.ok());
    plain = std::move(*owned).Release();
  }
  ASSERT_TRUE(plain.reference().has_value());
  EXPECT_TRUE(*store->Exists(plain.reference()->key));
  EXPECT_EQ(*plain.Extract(), "handed over");
}

TEST(BorrowedProxy, IsANonOwningViewSharingTheResolution) {
  CountingConnector* counter;
  auto store = MemoryStore(&counter);
  auto owned = store->MakeOwnedProxy(std::string("shared"));
  ASSERT_TRUE(owned.ok());
  {
    BorrowedProxy<std::string> a = owned->Borrow();
    BorrowedProxy<std::string> b = a;
    EXPECT_EQ(**a.Get(), "shared");
    EXPECT_TRUE(b.is_resolved());
    EXPECT_TRUE(owned->is_resolved());
    EXPECT_EQ(b.key(), owned->key());
  }
  EXPECT_EQ(counter->gets.load(), 1);
  EXPECT_TRUE(*store->Exists(owned->key())) << "dropping borrows never evicts";
  ASSERT_TRUE(owned->Reset().ok());
  EXPECT_FALSE(*store->Exists(owned->key()));
}

TEST(ContextLifetime, EvictsEveryKeyAtScopeEnd) {
  auto store = MemoryStore();
  std::vector<Key> keys;
  {
    ContextLifetime lifetime;
    for (int i = 0; i < 3; ++i) {
      auto p = store->MakeProxy(std::to_string(i), {}, &lifetime);
      ASSERT_TRUE(p.ok());
      keys.push_back(p->reference()->key);
    }
    EXPECT_EQ(lifetime.size(), 3u);
    for (const Key& k : keys) EXPECT_TRUE(*store->Exists(k));
  }
  for (const Key& k : keys) EXPECT_FALSE(*store->Exists(k));
  // An ended lifetime refuses new keys, and the put is undone.
  ContextLifetime ended;
  ASSERT_TRUE(ended.Close().ok());
  EXPECT_TRUE(ended.done());
  auto late = store->MakeProxy(std::string("late"), {}, &ended);
  EXPECT_EQ(late.status().code(), StatusCode::kFailedPrecondition);
}

// Waits (generously) until `pred` holds; false if it never does.
template <typename Pred>
bool Eventually(Pred pred, std::chrono::seconds limit = std::chrono::seconds(60)) {
  auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

// One try of an extended lease that keeps its keys, then lapses. The lease
// is extended every few ms for longer than its length: the sleep paces the
// extensions while the clock passes the first expiry, it orders nothing. A
// lease can only lapse once the clock has passed its expiry, so what this
// thread sees before that time is conclusive; if it was descheduled past the
// expiry (only a stall longer than the lease does that), the try proves
// nothing and returns false, to be repeated with a longer lease.
bool ExtendedLeaseTry(std::chrono::milliseconds length) {
  auto store = MemoryStore();
  LeaseLifetime lease(length);
  auto alive_until = lease.expiry();  // no lapse before this time
  auto p = store->MakeProxy(std::string("leased"), {}, &lease);
  if (!p.ok()) {
    EXPECT_GE(Clock::now(), alive_until) << "the put was refused before the lease lapsed";
    EXPECT_EQ(p.status().code(), StatusCode::kFailedPrecondition);
    return false;
  }
  Key key = p->reference()->key;
  auto start = Clock::now();
  while (Clock::now() - start < length + length / 4) {
    Status extended = lease.Extend(length);
    if (!extended.ok()) {
      EXPECT_GE(Clock::now(), alive_until) << "the lease lapsed before its expiry";
      EXPECT_EQ(extended.code(), StatusCode::kFailedPrecondition);
      return false;
    }
    alive_until = lease.expiry();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const bool kept = *store->Exists(key);
  const bool done = lease.done();
  if (Clock::now() >= alive_until) return false;
  EXPECT_TRUE(kept) << "an extended lease must not evict";
  EXPECT_FALSE(done);
  EXPECT_GT(lease.expiry(), start + length) << "extensions moved the expiry";
  // Now let it lapse.
  EXPECT_TRUE(Eventually([&] { return !*store->Exists(key); }));
  EXPECT_TRUE(Eventually([&] { return lease.done(); }));
  EXPECT_EQ(lease.Extend(length).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(store->MakeProxy(std::string("x"), {}, &lease).status().code(),
            StatusCode::kFailedPrecondition);
  return true;
}

TEST(LeaseLifetime, ExtendedLeaseKeepsItsKeysThenLapses) {
  for (auto length = std::chrono::milliseconds(500); length <= std::chrono::seconds(32);
       length *= 2) {
    if (ExtendedLeaseTry(length) || HasFailure()) return;
  }
  FAIL() << "this thread stalled for longer than every lease tried (up to 32 s)";
}

TEST(LeaseLifetime, ShortLeaseLapsesAndCloseEndsAtOnce) {
  auto store = MemoryStore();
  LeaseLifetime short_lease(std::chrono::milliseconds(50));
  auto a = store->MakeProxy(std::string("a"), {}, &short_lease);
  // The lease may already have lapsed on a loaded machine: then the put is undone.
  if (a.ok()) {
    EXPECT_TRUE(Eventually([&] { return !*store->Exists(a->reference()->key); }));
  } else {
    EXPECT_EQ(a.status().code(), StatusCode::kFailedPrecondition);
  }
  Key b;
  {
    LeaseLifetime long_lease(std::chrono::hours(1));
    auto p = store->MakeProxy(std::string("b"), {}, &long_lease);
    ASSERT_TRUE(p.ok());
    b = p->reference()->key;
    EXPECT_TRUE(*store->Exists(b));
    ASSERT_TRUE(long_lease.Close().ok());
    EXPECT_FALSE(*store->Exists(b)) << "Close evicts now, not in an hour";
  }
}

}  // namespace
}  // namespace xsilo
