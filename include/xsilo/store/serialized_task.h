// The cross-process form of a StoreExecutor task: a registered function's
// name, the store's config, each argument's key (or, when small, its encoded
// bytes) and a deferred result key, as a few hundred bytes of JSON. A pool
// whose workers are other processes carries only this text:
//
//   // every worker process, once:
//   TaskRegistry functions;
//   functions.Register("sum", [](const Vec& v) { return Total(v); });
//   // per task:
//   XSILO_ASSIGN_OR_RETURN(SerializedTask task, SerializedTask::Deserialize(text));
//   XSILO_RETURN_IF_ERROR(task.Run(functions));
//
//   // the submitter (executor.h):
//   XSILO_ASSIGN_OR_RETURN(RemoteTask<double> t, executor.Describe<double>("sum", big));
//   Send(t.Serialize());
//   Result<double> total = t.Await(std::chrono::minutes(5));
//
// The worker finds the store by name in its StoreRegistry (or creates it from
// the config, once), resolves the arguments, calls the function, evicts the
// stored arguments and sets the result key to the outcome: the value encoded
// by Codec<R> followed by the byte 'V', or the error as JSON
// ({"code":..,"message":..}) followed by 'E'. The submitter waits for that
// key (Store::WaitForKey: notified on redis, polled otherwise), decodes it and
// evicts it.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "xsilo/store/store.h"

namespace xsilo {

class TaskRegistry;
class StoreExecutor;

struct SerializedTask {
  struct Argument {
    std::optional<Key> key;  // the encoded object in `store`; Run evicts it
    Buffer value;            // else the encoded object itself (a small one)
  };

  std::string function;  // a name in the worker's TaskRegistry
  StoreConfig store;     // holds the arguments; receives the result
  std::vector<Argument> arguments;
  Key result;  // a deferred key (Store::NewKey) that Run sets

  // Compact JSON; inline values in base64.
  std::string Serialize() const;
  static Result<SerializedTask> Deserialize(std::string_view json);

  // Runs the task here: the store of `store.name` in `stores` (created from
  // the config if absent), the function of that name in `functions`. The
  // task's own failure (unknown function, an argument missing, the function
  // threw or returned an error) is written to the result key for the
  // submitter, and Run returns OK: the outcome was delivered. An error from
  // Run means nothing could be written (the submitter will time out).
  Status Run(const TaskRegistry& functions, StoreRegistry* stores = &StoreRegistry::Global()) const;
};

namespace detail {

// Parameter and return types of a function pointer or of a class with one
// non-template operator() (a lambda without auto parameters).
template <typename F>
struct FunctionTraits : FunctionTraits<decltype(&F::operator())> {};
template <typename R, typename... A>
struct FunctionTraits<R (*)(A...)> {
  using Return = R;
  using Args = std::tuple<std::remove_cvref_t<A>...>;
};
template <typename R, typename... A>
struct FunctionTraits<R (*)(A...) noexcept> : FunctionTraits<R (*)(A...)> {};
template <typename R, typename C, typename... A>
struct FunctionTraits<R (C::*)(A...)> : FunctionTraits<R (*)(A...)> {};
template <typename R, typename C, typename... A>
struct FunctionTraits<R (C::*)(A...) const> : FunctionTraits<R (*)(A...)> {};
template <typename R, typename C, typename... A>
struct FunctionTraits<R (C::*)(A...) noexcept> : FunctionTraits<R (*)(A...)> {};
template <typename R, typename C, typename... A>
struct FunctionTraits<R (C::*)(A...) const noexcept> : FunctionTraits<R (*)(A...)> {};

template <typename T>
struct IsResult : std::false_type {};
template <typename T>
struct IsResult<Result<T>> : std::true_type {};

// Called by a registered function's runner with the encoded value while
// the value is alive; returns whether it was written.
using DeliverValue = std::function<Status(const GatherList& value)>;
using TaskRunner =
    std::function<Status(const SerializedTask& task, Store& store, const DeliverValue& deliver)>;

template <typename A>
Result<A> LoadArgument(const SerializedTask& task, size_t index, Store& store) {
  const SerializedTask::Argument& arg = task.arguments[index];
  if (!arg.key) return Codec<A>::Decode(arg.value);
  XSILO_ASSIGN_OR_RETURN(std::optional<A> object, store.Get<A>(*arg.key));
  if (!object) {
    return NotFound("argument " + std::to_string(index) + " of task '" + task.function +
                    "' is not in store '" + task.store.name + "' (evicted, or never put)");
  }
  return std::move(*object);
}

template <typename R>
Status DeliverResult(R&& value, const DeliverValue& deliver) {
  using V = std::remove_cvref_t<R>;
  static_assert(Encodable<V>, "a registered function's result must be Encodable");
  XSILO_ASSIGN_OR_RETURN(GatherList bytes, Codec<V>::Encode(value));
  return deliver(bytes);
}

template <typename F, typename Ret, typename... A, size_t... I>
Status RunRegistered(F& fn, const SerializedTask& task, Store& store, const DeliverValue& deliver,
                     std::index_sequence<I...>) {
  static_assert((Encodable<A> && ...), "a registered function's parameters must be Encodable");
  if (task.arguments.size() != sizeof...(A)) {
    return InvalidArgument("task '" + task.function + "' takes " + std::to_string(sizeof...(A)) +
                           " arguments, the description has " +
                           std::to_string(task.arguments.size()));
  }
  std::tuple<std::optional<A>...> loaded;
  Status st;
  (
      [&] {
        if (!st.ok()) return;
        Result<A> arg = LoadArgument<A>(task, I, store);
        if (arg.ok()) {
          std::get<I>(loaded).emplace(std::move(arg).value());
        } else {
          st = arg.status();
        }
      }(),
      ...);
  XSILO_RETURN_IF_ERROR(st);
  if constexpr (std::is_void_v<Ret>) {
    fn(*std::get<I>(loaded)...);
    return deliver(GatherList{});
  } else if constexpr (std::is_same_v<std::remove_cvref_t<Ret>, Status>) {
    XSILO_RETURN_IF_ERROR(fn(*std::get<I>(loaded)...));
    return deliver(GatherList{});
  } else if constexpr (IsResult<std::remove_cvref_t<Ret>>::value) {
    auto result = fn(*std::get<I>(loaded)...);
    if (!result.ok()) return result.status();
    return DeliverResult(std::move(result).value(), deliver);
  } else {
    return DeliverResult(fn(*std::get<I>(loaded)...), deliver);
  }
}

template <typename F, typename Ret, typename... A>
TaskRunner MakeTaskRunner(F fn, std::tuple<A...>*) {
  return [fn = std::move(fn)](const SerializedTask& task, Store& store,
                              const DeliverValue& deliver) mutable -> Status {
    return RunRegistered<F, Ret, A...>(fn, task, store, deliver, std::index_sequence_for<A...>{});
  };
}

// What a worker wrote to the result key: the task's error, or OK and the
// value's bytes.
struct RemoteOutcome {
  Status task_status;
  Buffer value;
};
// The submitter's side of RemoteTask::Await: waits for the result key, reads
// the outcome and frees the task's objects (arguments and result). An error
// means the outcome could not be read (Timeout: not set in time) and nothing
// was freed.
Result<RemoteOutcome> AwaitOutcome(Store& store, const SerializedTask& task,
                                   std::chrono::milliseconds timeout);
// Evicts the task's stored arguments and its result key (idempotent).
void FreeTaskObjects(Store& store, const SerializedTask& task);

}  // namespace detail

// Functions a worker process can run by name. Register every function once,
// before the first Run; Register and Find may be called from many threads.
class TaskRegistry {
 public:
  // `fn`: a function pointer or a lambda (no auto parameters) whose
  // parameters are Encodable types, by value or const&, and which returns
  // an Encodable R, Result<R>, Status or void. AlreadyExists when the name
  // is taken.
  template <typename F>
  Status Register(std::string name, F fn) {
    using Traits = detail::FunctionTraits<std::decay_t<F>>;
    auto runner = std::make_shared<const detail::TaskRunner>(
        detail::MakeTaskRunner<std::decay_t<F>, typename Traits::Return>(
            std::move(fn), static_cast<typename Traits::Args*>(nullptr)));
    std::lock_guard<std::mutex> lock(mu_);
    if (!runners_.emplace(name, std::move(runner)).second) {
      return AlreadyExists("task function '" + name + "' is registered already");
    }
    return Status::OK();
  }

  // The runner registered under `name`, or null.
  std::shared_ptr<const detail::TaskRunner> Find(std::string_view name) const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<const detail::TaskRunner>, std::less<>> runners_;
};

// The submitter's handle to a task another process runs (made by
// StoreExecutor::Describe). It owns the task's objects in the store: Await
// frees them once it has read the outcome, and a handle destroyed before
// that frees them too (the task is abandoned: a worker that starts it later
// finds its arguments gone). Move-only.
template <typename R>
class RemoteTask {
 public:
  // What Await returns: Status for a task without a value.
  using Value = std::conditional_t<std::is_void_v<R>, Status, Result<R>>;

  RemoteTask(std::shared_ptr<Store> store, SerializedTask task)
      : store_(std::move(store)), task_(std::move(task)) {}
  ~RemoteTask() { Abandon(); }
  RemoteTask(RemoteTask&& other) noexcept
      : store_(std::move(other.store_)), task_(std::move(other.task_)) {
    other.store_.reset();
  }
  RemoteTask& operator=(RemoteTask&& other) noexcept {
    if (this != &other) {
      Abandon();
      store_ = std::move(other.store_);
      task_ = std::move(other.task_);
      other.store_.reset();
    }
    return *this;
  }
  RemoteTask(const RemoteTask&) = delete;
  RemoteTask& operator=(const RemoteTask&) = delete;

  const SerializedTask& task() const { return task_; }
  std::string Serialize() const { return task_.Serialize(); }

  // Waits up to `timeout` for the worker's outcome: the value, or the
  // task's error. Timeout when it is not there yet, or the store's error
  // when it cannot be read (then nothing is freed and Await may be called
  // again); FailedPrecondition after an earlier Await got the outcome.
  Value Await(std::chrono::milliseconds timeout) {
    if (!store_) {
      return FailedPrecondition("remote task '" + task_.function + "': awaited already");
    }
    Result<detail::RemoteOutcome> outcome = detail::AwaitOutcome(*store_, task_, timeout);
    if (!outcome.ok()) return outcome.status();  // nothing freed: Await may be called again
    store_.reset();                              // read, and the task's objects freed
    if (!outcome->task_status.ok()) return outcome->task_status;
    if constexpr (std::is_void_v<R>) {
      return Status::OK();
    } else {
      return Codec<R>::Decode(outcome->value);
    }
  }

 private:
  friend class StoreExecutor;  // Describe fills task_ after the handle owns it

  void Abandon() {
    if (store_ && !store_->closed()) detail::FreeTaskObjects(*store_, task_);
    store_.reset();
  }

  std::shared_ptr<Store> store_;  // null once awaited or moved from
  SerializedTask task_;
};

}  // namespace xsilo
