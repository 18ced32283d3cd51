// StoreExecutor: runs tasks on any TaskPool, with large arguments and
// results travelling through a Store as proxies (after ProxyStore's
// StoreExecutor; the Python one is python/xsilo/executor.py).
//
//   auto pool = std::make_shared<ThreadPool>(4);
//   StoreExecutor ex(pool, store, ProxySize(1 << 20));
//   TaskFuture<Vec> f = ex.Submit([](const Vec& v) { return Scale(v, 2); }, big);
//   Result<Vec> scaled = f.Get();
//
// Arguments. Each argument of an Encodable type (Codec<T> exists) is
// encoded on the submitting thread and shown to the policy; one it accepts
// is put in the store once and crosses to the task as a Proxy<T> (a key),
// which the task resolves before calling fn. Others are moved (or copied)
// into the task. fn gets every Encodable argument as const T& (so it may take
// const T& or T) and every other argument as an rvalue. Each stored input is
// evicted when its task has finished, successfully or not, before its
// future becomes ready.
//
// Result. fn may return R, Result<R>, Status or void. An Encodable R the
// policy accepts is put in the store by the worker and comes back as a
// proxy that evicts its object when resolved; otherwise the value is held
// in the future. TaskFuture<R>::Get() returns Result<R> either way;
// GetProxy() gives the result as a Proxy<R> without fetching it.
//
// Errors never throw across threads: a failed put or encode, a pool that
// refuses or drops the task, an argument that does not resolve, an
// exception from fn (Internal, with its what()) and an error fn returns all
// end in the future's Status, and the task's stored inputs are evicted in
// every case.
//
// Threads: Submit and Describe may be called from many threads; the policy
// is called on submitting threads (arguments) and workers (results) at
// once. A task must not block on another task of a bounded pool (with all
// threads waiting, nothing runs).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <utility>
#include <vector>

#include "xsilo/store/proxy.h"
#include "xsilo/store/serialized_task.h"
#include "xsilo/store/task_pool.h"

namespace xsilo {

// ---- policies: which objects go through the store --------------------------

struct ProxyCandidate {
  std::type_index type;    // the object's C++ type
  uint64_t bytes = 0;      // its size encoded by Codec<T>
  bool is_result = false;  // a task's result (else one of its arguments)
};
// Must be safe to call from many threads at once.
using ProxyPolicy = std::function<bool(const ProxyCandidate&)>;

ProxyPolicy ProxyAlways();
ProxyPolicy ProxyNever();
// Objects whose encoded size is at least `min_bytes`.
ProxyPolicy ProxySize(uint64_t min_bytes);
// Objects of these types.
template <typename... T>
ProxyPolicy ProxyType() {
  return [](const ProxyCandidate& c) { return ((c.type == std::type_index(typeid(T))) || ...); };
}

struct ExecutorMetrics {
  uint64_t tasks = 0;              // Submit and Describe calls
  uint64_t failed = 0;             // Submit futures that ended in an error
  uint64_t proxied_arguments = 0;  // put in the store, crossed as a key
  uint64_t inline_arguments = 0;   // moved or copied into the task
  uint64_t proxied_results = 0;    // put in the store by the worker
  uint64_t inline_results = 0;     // held in the future
  uint64_t evict_errors = 0;       // stored inputs whose eviction failed (store open)
};

namespace detail {

struct ExecutorCounters {
  std::atomic<uint64_t> tasks{0}, failed{0}, proxied_arguments{0}, inline_arguments{0},
      proxied_results{0}, inline_results{0}, evict_errors{0};
};

// The keys put for one task's arguments; evicted once, whatever happens.
// Not thread-safe: a task's job owns it.
class TaskInputs {
 public:
  TaskInputs(std::shared_ptr<Store> store, std::shared_ptr<ExecutorCounters> counters)
      : store_(std::move(store)), counters_(std::move(counters)) {}
  void Add(Key key) { keys_.push_back(std::move(key)); }
  // Evicts every key once; nothing when the store is closed (its connector
  // is gone). Failures are counted in ExecutorMetrics::evict_errors.
  void EvictAll();

 private:
  std::shared_ptr<Store> store_;
  std::shared_ptr<ExecutorCounters> counters_;
  std::vector<Key> keys_;
};

// What fn receives for an argument of type A.
template <typename A>
using TaskArg =
    std::conditional_t<Encodable<std::decay_t<A>>, const std::decay_t<A>&, std::decay_t<A>&&>;

template <typename T>
struct UnwrapReturn {
  using type = T;
};
template <typename T>
struct UnwrapReturn<Result<T>> {
  using type = T;
};
template <>
struct UnwrapReturn<Status> {
  using type = void;
};

template <typename F, typename... Args>
using TaskReturn = std::invoke_result_t<std::decay_t<F>&, TaskArg<Args>...>;
// The value a task's future carries: fn's return without Result / Status.
template <typename F, typename... Args>
using TaskValue = typename UnwrapReturn<std::remove_cvref_t<TaskReturn<F, Args...>>>::type;

// The outcome a finished task leaves in its future.
template <typename R>
using TaskOutcome =
    std::conditional_t<std::is_void_v<R>, Status,
                       std::conditional_t<Encodable<R>, Result<Proxy<R>>, Result<R>>>;

template <typename R>
struct TaskState {
  explicit TaskState(std::shared_ptr<Store> s) : store(std::move(s)) {}

  // Publishes the outcome, or drops it when every future is gone already.
  void Finish(TaskOutcome<R> o) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (outcome) return;
      if (!abandoned) {
        outcome.emplace(std::move(o));
        cv.notify_all();
        return;
      }
    }
    DropUnclaimed(o);
  }

  // The last future is gone: a stored result it never took (resolved or
  // handed out by GetProxy) belongs to no one, so it is evicted now, or by
  // Finish if the task has not finished yet. The mutex decides which.
  void Abandon() {
    std::optional<TaskOutcome<R>> unclaimed;
    {
      std::lock_guard<std::mutex> lock(mu);
      abandoned = true;
      if (outcome && !handed_out) unclaimed = *outcome;
    }
    if (unclaimed) DropUnclaimed(*unclaimed);
  }

  void DropUnclaimed(TaskOutcome<R>& o) {
    if constexpr (Encodable<R>) {
      if (!o.ok() || !store || store->closed()) return;
      Proxy<R>& proxy = o.value();
      if (proxy.reference() && !proxy.is_resolved()) (void)store->Evict(proxy.reference()->key);
    }
  }

  const std::shared_ptr<Store> store;
  std::mutex mu;
  std::condition_variable cv;
  std::optional<TaskOutcome<R>> outcome;
  bool handed_out = false;  // GetProxy gave the result away
  bool abandoned = false;   // every future is gone
};

// Shared by a task's futures (not by its job): its end is the last future's.
template <typename R>
struct FutureHandle {
  explicit FutureHandle(std::shared_ptr<TaskState<R>> s) : state(std::move(s)) {}
  ~FutureHandle() { state->Abandon(); }
  FutureHandle(const FutureHandle&) = delete;
  FutureHandle& operator=(const FutureHandle&) = delete;
  const std::shared_ptr<TaskState<R>> state;
};

}  // namespace detail

// A task's future, from StoreExecutor::Submit. Copies share one outcome;
// Get may be called many times and from many threads. An outcome that is
// never taken is cleaned up: when the last copy goes, a stored result that
// was neither resolved nor handed out by GetProxy is evicted (then, or when
// the task finishes, if it has not yet).
template <typename R>
class TaskFuture {
 public:
  // What Get returns: Status for a task without a value.
  using Value = std::conditional_t<std::is_void_v<R>, Status, Result<R>>;

  TaskFuture() = default;
  explicit TaskFuture(std::shared_ptr<detail::TaskState<R>> state)
      : handle_(std::make_shared<detail::FutureHandle<R>>(state)), state_(std::move(state)) {}

  bool valid() const { return state_ != nullptr; }
  bool Ready() const { return WaitFor(std::chrono::milliseconds(0)); }
  // True once the task has finished (or failed).
  bool WaitFor(std::chrono::milliseconds timeout) const {
    if (!state_) return false;
    std::unique_lock<std::mutex> lock(state_->mu);
    return state_->cv.wait_for(lock, timeout, [&] { return state_->outcome.has_value(); });
  }
  void Wait() const {
    if (!state_) return;
    std::unique_lock<std::mutex> lock(state_->mu);
    state_->cv.wait(lock, [&] { return state_->outcome.has_value(); });
  }

  // Waits for the task: its value or its error. A stored result is fetched
  // on the first call (which evicts it from the store), then copied out.
  Value Get() {
    if (!state_) return FailedPrecondition("task future: no task");
    Wait();
    return Take();
  }
  // Timeout when the task has not finished within `timeout` (it goes on).
  Value Get(std::chrono::milliseconds timeout) {
    if (!state_) return FailedPrecondition("task future: no task");
    if (!WaitFor(timeout)) return Timeout("task not finished within the timeout");
    return Take();
  }

  // Waits for the task; the result as a proxy, not fetched. A stored result's
  // proxy has a reference (Serialize it to hand the result to another
  // process) and evicts its object when resolved; the future no longer
  // evicts it. A small result's proxy holds the value (resolved, no
  // reference).
  Result<Proxy<R>> GetProxy() requires Encodable<R> {
    if (!state_) return FailedPrecondition("task future: no task");
    Wait();
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->handed_out = true;
    return *state_->outcome;
  }

 private:
  Value Take() {
    if constexpr (Encodable<R>) {
      Result<Proxy<R>> proxy = [&] {
        std::lock_guard<std::mutex> lock(state_->mu);
        return *state_->outcome;
      }();
      if (!proxy.ok()) return proxy.status();
      return proxy->Extract();
    } else {
      std::lock_guard<std::mutex> lock(state_->mu);
      return *state_->outcome;
    }
  }

  std::shared_ptr<detail::FutureHandle<R>> handle_;
  std::shared_ptr<detail::TaskState<R>> state_;  // handle_->state
};

namespace detail {

// One argument inside a task: a proxy to resolve or the value itself.
template <typename T, bool kEncodable = Encodable<T>>
struct ArgSlot {  // not Encodable: always by value, moved into the call
  std::optional<T> value;
  Status Resolve() { return Status::OK(); }
  T&& Ref() { return std::move(*value); }
};
template <typename T>
struct ArgSlot<T, true> {
  std::optional<T> value;
  std::optional<Proxy<T>> proxy;
  Status Resolve() { return proxy ? proxy->Resolve() : Status::OK(); }
  const T& Ref() { return proxy ? *proxy->Get().value() : *value; }
};

template <typename T>
bool OutcomeOk(const T& outcome) {
  return outcome.ok();
}

// One submitted task: its arguments, its inputs in the store and its
// future's state. The pool's closure shares it; it finishes exactly once:
// run, failed at submission, or dropped by the pool unrun (its destructor).
template <typename R, typename F, typename... Ts>
class Job {
 public:
  Job(std::shared_ptr<TaskState<R>> state, std::shared_ptr<Store> store,
      std::shared_ptr<const ProxyPolicy> policy, std::shared_ptr<ExecutorCounters> counters, F fn)
      : state_(std::move(state)),
        store_(std::move(store)),
        policy_(std::move(policy)),
        counters_(std::move(counters)),
        inputs_(store_, counters_),
        fn_(std::move(fn)) {}
  ~Job() {
    if (!claimed_.exchange(true)) {
      Finish(Cancelled("the task pool dropped the task without running it"));
    }
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // On the submitting thread: stores or keeps each argument.
  template <typename... As>
  Status Fill(As&&... args) {
    Status st;
    [&]<size_t... I>(std::index_sequence<I...>) {
      (
          [&] {
            if (st.ok()) st = FillOne(std::get<I>(slots_), std::forward<As>(args), I);
          }(),
          ...);
    }
    (std::index_sequence_for<As...>{});
    return st;
  }

  void Run() {
    if (claimed_.exchange(true)) return;
    Finish(Execute());
  }

  void Fail(Status error) {
    if (claimed_.exchange(true)) return;
    Finish(std::move(error));
  }

 private:
  template <typename T, typename A>
  Status FillOne(ArgSlot<T>& slot, A&& arg, size_t index) {
    if constexpr (Encodable<T>) {
      Result<GatherList> bytes = Codec<T>::Encode(arg);
      if (!bytes.ok()) return bytes.status().WithContext("encoding argument " + Index(index));
      if ((*policy_)(ProxyCandidate{typeid(T), bytes->size, false})) {
        Result<Key> key = store_->PutBytes(*bytes);
        if (!key.ok()) return key.status().WithContext("storing argument " + Index(index));
        slot.proxy.emplace(store_->template ProxyFor<T>(*key));
        inputs_.Add(std::move(key).value());
        ++counters_->proxied_arguments;
        return Status::OK();
      }
    }
    slot.value.emplace(std::forward<A>(arg));
    ++counters_->inline_arguments;
    return Status::OK();
  }

  static std::string Index(size_t index) { return std::to_string(index); }

  TaskOutcome<R> Execute() {
    try {
      Status st;
      [&]<size_t... I>(std::index_sequence<I...>) {
        (
            [&] {
              if (!st.ok()) return;
              st = std::get<I>(slots_).Resolve();
              if (!st.ok()) st = st.WithContext("resolving argument " + Index(I));
            }(),
            ...);
      }
      (std::index_sequence_for<Ts...>{});
      if (!st.ok()) return st;
      auto call = [&]() -> decltype(auto) {
        return std::apply([&](auto&... slot) -> decltype(auto) { return fn_(slot.Ref()...); },
                          slots_);
      };
      using Ret = std::remove_cvref_t<decltype(call())>;
      if constexpr (std::is_void_v<Ret>) {
        call();
        return Status::OK();
      } else if constexpr (std::is_same_v<Ret, Status>) {
        return Status(call());
      } else if constexpr (IsResult<Ret>::value) {
        Ret result = call();
        if (!result.ok()) return result.status();
        return Deliver(std::move(result).value());
      } else {
        return Deliver(call());
      }
    } catch (const std::exception& e) {
      return Internal(std::string("task threw: ") + e.what());
    } catch (...) {
      return Internal("task threw a non-standard exception");
    }
  }

  template <typename V>
  TaskOutcome<R> Deliver(V&& returned) {
    R value(std::forward<V>(returned));
    if constexpr (Encodable<R>) {
      Result<GatherList> bytes = Codec<R>::Encode(value);
      if (!bytes.ok()) return bytes.status().WithContext("encoding the result");
      if ((*policy_)(ProxyCandidate{typeid(R), bytes->size, true})) {
        Result<Key> key = store_->PutBytes(*bytes);
        if (!key.ok()) return key.status().WithContext("storing the result");
        ++counters_->proxied_results;
        return store_->template ProxyFor<R>(*key, {.evict_on_resolve = true});
      }
      ++counters_->inline_results;
      Proxy<R> held([]() -> Result<R> { return Internal("a held result has no factory"); });
      held.Populate(std::move(value));
      return held;
    } else {
      ++counters_->inline_results;
      return value;
    }
  }

  // Inputs go before the outcome is published: a ready future means they
  // are gone.
  void Finish(TaskOutcome<R> outcome) {
    inputs_.EvictAll();
    if (!OutcomeOk(outcome)) ++counters_->failed;
    state_->Finish(std::move(outcome));
  }

  std::shared_ptr<TaskState<R>> state_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<const ProxyPolicy> policy_;
  std::shared_ptr<ExecutorCounters> counters_;
  TaskInputs inputs_;
  F fn_;
  std::tuple<ArgSlot<Ts>...> slots_;
  std::atomic<bool> claimed_{false};
};

}  // namespace detail

class StoreExecutor {
 public:
  // `should_proxy` defaults to ProxySize(64 KiB), like the Python one. A
  // null pool or store fails every task with InvalidArgument.
  StoreExecutor(std::shared_ptr<TaskPool> pool, std::shared_ptr<Store> store,
                ProxyPolicy should_proxy = ProxySize(64 << 10));

  // Runs fn(args...) on the pool; see the top of this file. Returns a
  // TaskFuture<R>, R being fn's value type (void for Status or nothing).
  // (The return type is deduced so that a call fn cannot take fails on the
  // static_assert's message, not on "no matching function".)
  template <typename F, typename... Args>
  auto Submit(F fn, Args&&... args) {
    static_assert(std::is_invocable_v<std::decay_t<F>&, detail::TaskArg<Args>...>,
                  "fn must take each Encodable argument as const T& (or T) and every other "
                  "argument as T&& (or T)");
    using R = detail::TaskValue<F, Args...>;
    auto state = std::make_shared<detail::TaskState<R>>(store_);
    TaskFuture<R> future(state);
    ++counters_->tasks;
    auto job = std::make_shared<detail::Job<R, std::decay_t<F>, std::decay_t<Args>...>>(
        std::move(state), store_, policy_, counters_, std::move(fn));
    if (!pool_ || !store_) {
      job->Fail(InvalidArgument("StoreExecutor: null task pool or store"));
      return future;
    }
    Status st = job->Fill(std::forward<Args>(args)...);
    if (st.ok()) st = pool_->Submit([job] { job->Run(); });
    if (!st.ok()) job->Fail(st.WithContext("submitting the task"));
    return future;
  }

  // The cross-process form (serialized_task.h): each argument is stored
  // (policy accepts) or inlined, a deferred result key is reserved, and the
  // handle's Serialize() is all a worker process needs, with `function`
  // registered in its TaskRegistry. R is that function's value type (void
  // for one returning Status or nothing).
  template <typename R, typename... Args>
  Result<RemoteTask<R>> Describe(std::string function, const Args&... args) {
    static_assert((Encodable<Args> && ...), "a remote task's arguments must be Encodable");
    if (!store_) return InvalidArgument("StoreExecutor: null store");
    ++counters_->tasks;
    SerializedTask task;
    task.function = std::move(function);
    task.store = store_->config();
    XSILO_ASSIGN_OR_RETURN(task.result, store_->NewKey());
    // From here the handle owns what is stored: a failure below frees it.
    RemoteTask<R> handle(store_, std::move(task));
    Status st;
    (
        [&] {
          if (st.ok()) st = DescribeArgument(handle, args);
        }(),
        ...);
    XSILO_RETURN_IF_ERROR(st);
    return handle;
  }

  ExecutorMetrics metrics() const;
  const std::shared_ptr<Store>& store() const { return store_; }
  const std::shared_ptr<TaskPool>& pool() const { return pool_; }

 private:
  template <typename R, typename T>
  Status DescribeArgument(RemoteTask<R>& handle, const T& arg) {
    SerializedTask& task = handle.task_;
    std::string index = std::to_string(task.arguments.size());
    Result<GatherList> bytes = Codec<T>::Encode(arg);
    if (!bytes.ok()) return bytes.status().WithContext("encoding argument " + index);
    SerializedTask::Argument out;
    if ((*policy_)(ProxyCandidate{typeid(T), bytes->size, false})) {
      Result<Key> key = store_->PutBytes(*bytes);
      if (!key.ok()) return key.status().WithContext("storing argument " + index);
      out.key = std::move(key).value();
      ++counters_->proxied_arguments;
    } else {
      XSILO_ASSIGN_OR_RETURN(out.value, bytes->Flatten());
      ++counters_->inline_arguments;
    }
    task.arguments.push_back(std::move(out));
    return Status::OK();
  }

  std::shared_ptr<TaskPool> pool_;
  std::shared_ptr<Store> store_;
  std::shared_ptr<const ProxyPolicy> policy_;
  std::shared_ptr<detail::ExecutorCounters> counters_;
};

}  // namespace xsilo
