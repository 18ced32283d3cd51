// TaskPool: where a StoreExecutor runs its tasks. Any pool joins by
// implementing Submit, or through MakeTaskPool with a lambda:
//
//   auto pool = MakeTaskPool([&](std::function<void()> task) {
//     asio::post(io_context, std::move(task));
//     return Status::OK();
//   });
//
// ThreadPool is a bounded in-process pool: a fixed number of threads over
// one queue (never a thread per task).
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "xsilo/core/status.h"

namespace xsilo {

class TaskPool {
 public:
  virtual ~TaskPool() = default;

  // Runs `task` once, later, on a thread of the pool. A non-OK status means
  // the task was refused and will never run. A pool may also destroy a task
  // it accepted without running it (at shutdown, say); StoreExecutor's
  // tasks notice that and fail their future with Cancelled.
  virtual Status Submit(std::function<void()> task) = 0;
};

// A pool that hands each task to `submit`.
std::shared_ptr<TaskPool> MakeTaskPool(std::function<Status(std::function<void()>)> submit);

// `threads` threads (at least 1) started at construction, one FIFO queue.
// Tasks must not throw (an exception escaping a task ends the process, as
// with std::thread); StoreExecutor's tasks never do.
class ThreadPool final : public TaskPool {
 public:
  explicit ThreadPool(int threads);
  // Shutdown(): the tasks already queued still run.
  ~ThreadPool() override;
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // FailedPrecondition once Shutdown has begun.
  Status Submit(std::function<void()> task) override;

  // Refuses new tasks, runs every queued one, then joins the threads.
  // Idempotent. Called from one of the pool's own tasks, it does not wait
  // for that thread (which finishes the queue and exits on its own).
  void Shutdown();

  int threads() const { return thread_count_; }

 private:
  // Shared with the threads, so that one detached by a Shutdown from its
  // own task may outlive the pool.
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    bool stopping = false;
  };
  static void Work(const std::shared_ptr<State>& state);

  const int thread_count_;
  const std::shared_ptr<State> state_;
  std::mutex threads_mu_;
  std::vector<std::thread> threads_;
};

}  // namespace xsilo
