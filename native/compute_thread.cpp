#include "compute_thread.h"
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

namespace weft {
namespace {

struct Job {
  const std::function<void()>* run;
  std::exception_ptr error;
  bool done = false;
};

// Jobs in arrival order, one at a time. Never destroyed: the thread lives as long as the process.
class ComputeThread {
 public:
  ComputeThread() { std::thread([this] { loop(); }).detach(); }

  void run(const std::function<void()>& fn) {
    Job job{&fn, nullptr};
    std::unique_lock<std::mutex> lock(mutex_);
    queue_.push_back(&job);
    wake_.notify_one();
    finished_.wait(lock, [&] { return job.done; });
    if (job.error) std::rethrow_exception(job.error);
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [this] { return !queue_.empty(); });
      Job* job = queue_.front();
      queue_.pop_front();
      lock.unlock();
      try {
        (*job->run)();
      } catch (...) {
        job->error = std::current_exception();
      }
      lock.lock();
      job->done = true;
      finished_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_, finished_;
  std::deque<Job*> queue_;
};

}  // namespace

void runOnComputeThread(const std::function<void()>& job) {
  static ComputeThread* thread = new ComputeThread();
  thread->run(job);
}

}  // namespace weft
