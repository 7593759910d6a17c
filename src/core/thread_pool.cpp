#include "core/thread_pool.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <system_error>

namespace gptoss {

ThreadPool::ThreadPool(int num_threads) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (num_threads <= 0) {
        // GPTOSS_NUM_THREADS: 1 .. 1024; anything else is said once and the core count used (a value past what the
        // system would start aborted every command).
        num_threads = cores;
        if (const char* env = std::getenv("GPTOSS_NUM_THREADS"); env != nullptr && *env != '\0') {
            char* end = nullptr;
            errno = 0;
            const long v = std::strtol(env, &end, 10);
            if (errno == 0 && *end == '\0' && v >= 1 && v <= kMaxThreads)
                num_threads = static_cast<int>(v);
            else
                std::fprintf(stderr, "warning: GPTOSS_NUM_THREADS='%s' is not a thread count from 1 to %d; using %d\n",
                             env, kMaxThreads, cores);
        }
    }
    for (int i = 0; i < num_threads - 1; ++i) {
        try {
            workers_.emplace_back([this, i] { worker_loop(i); });
        } catch (const std::system_error& e) {  // the system's thread or memory limit: run with those started
            std::fprintf(stderr, "warning: started %zu of %d threads (%s)\n", workers_.size() + 1, num_threads,
                         e.what());
            break;
        }
    }
}

ThreadPool::~ThreadPool() {
    {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
    }
    cv_start_.notify_all();
    for (auto& t : workers_) t.join();
}

ThreadPool& ThreadPool::global() {
    static ThreadPool pool;
    return pool;
}

void ThreadPool::worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
        std::pair<int64_t, int64_t> chunk;
        const std::function<void(int64_t, int64_t)>* task;
        {
            std::unique_lock<std::mutex> lock(mu_);
            cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
            if (stop_) return;
            seen = generation_;
            if (static_cast<size_t>(index + 1) >= chunks_.size()) continue;  // no chunk for this worker
            chunk = chunks_[index + 1];
            task = task_;
        }
        (*task)(chunk.first, chunk.second);
        {
            std::lock_guard<std::mutex> lock(mu_);
            if (--pending_ == 0) cv_done_.notify_one();
        }
    }
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn, int64_t min_chunk) {
    if (n <= 0) return;
    min_chunk = std::max<int64_t>(1, min_chunk);
    int64_t max_parts = std::max<int64_t>(1, n / min_chunk);
    int parts = static_cast<int>(std::min<int64_t>(num_threads(), max_parts));
    if (parts == 1) {
        fn(0, n);
        return;
    }
    std::lock_guard<std::mutex> call_lock(call_mu_);
    {
        std::lock_guard<std::mutex> lock(mu_);
        chunks_.clear();
        for (int p = 0; p < parts; ++p) chunks_.emplace_back(n * p / parts, n * (p + 1) / parts);
        task_ = &fn;
        pending_ = parts - 1;
        ++generation_;
    }
    cv_start_.notify_all();
    fn(chunks_[0].first, chunks_[0].second);
    std::unique_lock<std::mutex> lock(mu_);
    cv_done_.wait(lock, [&] { return pending_ == 0; });
}

}  // namespace gptoss
