// ThreadPool and MakeTaskPool (include/xsilo/store/task_pool.h).
#include <algorithm>
#include <utility>

#include "xsilo/store/task_pool.h"

namespace xsilo {

namespace {

class FunctionTaskPool final : public TaskPool {
 public:
  explicit FunctionTaskPool(std::function<Status(std::function<void()>)> submit)
      : submit_(std::move(submit)) {}
  Status Submit(std::function<void()> task) override {
    if (!submit_) return FailedPrecondition("task pool: no submit function");
    return submit_(std::move(task));
  }

 private:
  const std::function<Status(std::function<void()>)> submit_;
};

}  // namespace

std::shared_ptr<TaskPool> MakeTaskPool(std::function<Status(std::function<void()>)> submit) {
  return std::make_shared<FunctionTaskPool>(std::move(submit));
}

ThreadPool::ThreadPool(int threads)
    : thread_count_(std::max(threads, 1)), state_(std::make_shared<State>()) {
  threads_.reserve(static_cast<size_t>(thread_count_));
  for (int i = 0; i < thread_count_; ++i) {
    threads_.emplace_back([state = state_] { Work(state); });
  }
}

ThreadPool::~ThreadPool() { Shutdown(); }

Status ThreadPool::Submit(std::function<void()> task) {
  if (!task) return InvalidArgument("thread pool: empty task");
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->stopping) return FailedPrecondition("thread pool is shut down");
    state_->queue.push_back(std::move(task));
  }
  state_->cv.notify_one();
  return Status::OK();
}

void ThreadPool::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    state_->stopping = true;
  }
  state_->cv.notify_all();
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(threads_mu_);
    threads.swap(threads_);
  }
  for (auto& t : threads) {
    if (t.get_id() == std::this_thread::get_id()) {
      t.detach();  // shut down from its own task: this thread drains and exits after it
    } else {
      t.join();
    }
  }
}

void ThreadPool::Work(const std::shared_ptr<State>& state) {
  std::unique_lock<std::mutex> lock(state->mu);
  for (;;) {
    state->cv.wait(lock, [&] { return state->stopping || !state->queue.empty(); });
    if (state->queue.empty()) return;  // stopping, and the queue has drained
    std::function<void()> task = std::move(state->queue.front());
    state->queue.pop_front();
    lock.unlock();
    task();
    task = nullptr;  // what the task holds is released before the next wait
    lock.lock();
  }
}

}  // namespace xsilo
