// A fixed pool of worker threads for data-parallel loops on the CPU backend.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gptoss {

class ThreadPool {
public:
    // num_threads <= 0: hardware concurrency (or $GPTOSS_NUM_THREADS when set).
    explicit ThreadPool(int num_threads = 0);
    ~ThreadPool();
    ThreadPool(const ThreadPool&) = delete;
    ThreadPool& operator=(const ThreadPool&) = delete;

    static constexpr int kMaxThreads = 1024;  // GPTOSS_NUM_THREADS's bound
    int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

    // Runs fn(begin, end) over [0, n) split into contiguous chunks of at least `min_chunk` items,
    // one chunk per thread (the caller's thread takes one). Returns when all chunks are done.
    // Not reentrant: do not call parallel_for from inside fn.
    void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk = 1);

    // The process-wide pool used by the CPU kernels.
    static ThreadPool& global();

private:
    void worker_loop(int index);

    std::vector<std::thread> workers_;
    std::mutex mu_;
    std::condition_variable cv_start_, cv_done_;
    const std::function<void(int64_t, int64_t)>* task_ = nullptr;
    std::vector<std::pair<int64_t, int64_t>> chunks_;
    uint64_t generation_ = 0;
    int pending_ = 0;
    bool stop_ = false;
    std::mutex call_mu_;  // serialises concurrent parallel_for callers
};

}  // namespace gptoss
