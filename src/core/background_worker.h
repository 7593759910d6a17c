// One job at a time on a thread of its own: the engine computes structured-output masks here while
// its own thread waits on the GPU's forward.
//
//   BackgroundWorker w;
//   w.run([&] { masks = compute(); });  // returns at once
//   forward();                           // meanwhile
//   w.wait();                            // the job is done (its exception, if any, rethrown here)
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace gptoss {

class BackgroundWorker {
public:
    BackgroundWorker();
    ~BackgroundWorker();  // waits for a running job
    BackgroundWorker(const BackgroundWorker&) = delete;
    BackgroundWorker& operator=(const BackgroundWorker&) = delete;

    // Starts `job`; waits first for the previous one if the caller did not.
    void run(std::function<void()> job);
    // Returns once the last job has finished; rethrows what it threw. Without a job: at once.
    void wait();

private:
    void loop();

    std::mutex mu_;
    std::condition_variable cv_;
    std::function<void()> job_;
    std::exception_ptr error_;
    bool busy_ = false;
    bool stop_ = false;
    std::thread thread_;  // last: starts after the members it reads
};

}  // namespace gptoss
