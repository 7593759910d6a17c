#include "core/background_worker.h"

#include <utility>

namespace gptoss {

BackgroundWorker::BackgroundWorker() : thread_([this] { loop(); }) {}

BackgroundWorker::~BackgroundWorker() {
    {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [this] { return !busy_; });
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
}

void BackgroundWorker::run(std::function<void()> job) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    job_ = std::move(job);
    error_ = nullptr;
    busy_ = true;
    lock.unlock();
    cv_.notify_all();
}

void BackgroundWorker::wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void BackgroundWorker::loop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
        cv_.wait(lock, [this] { return stop_ || busy_; });
        if (busy_) {
            std::function<void()> job = std::move(job_);
            lock.unlock();
            std::exception_ptr error;
            try {
                job();
            } catch (...) {
                error = std::current_exception();
            }
            lock.lock();
            error_ = error;
            busy_ = false;
            cv_.notify_all();
        } else if (stop_) {
            return;
        }
    }
}

}  // namespace gptoss
