// The GPU kernels of one decode step as they ran, from CUPTI's activity records (start and end
// timestamps of every kernel, graph nodes included), for `gptoss bench` with
// GPTOSS_KERNEL_TRACE=<csv path>. A diagnostic: it tells, inside the replayed CUDA graph with its
// programmatic dependent launches, how long each kernel adds to the step (the gap from the previous
// kernel's end to its own end), which per-stage events cannot (GPTOSS_PROFILE serializes the stages)
// and nsys cannot on the device machine (KINDS.md).
//
// libcupti is loaded at run time (dlopen) only when the variable is set: the binary neither links
// nor needs it otherwise.
#pragma once

#include <memory>
#include <string>

namespace gptoss::cli {

class KernelTrace {
public:
    // Null unless GPTOSS_KERNEL_TRACE names a file and libcupti loads and accepts the activity
    // kind (a message on stderr says why not).
    static std::unique_ptr<KernelTrace> from_env();
    virtual ~KernelTrace() = default;
    // Kernel records are collected between start() and stop(). stop() flushes them and appends the
    // last complete step to the CSV: rows `label, step_us, index, name, start_us, end_us, adds_us,
    // grid, block` with times relative to the step's first kernel; a step begins at each kernel
    // whose name contains `step_first` (the decode step's embedding kernel).
    virtual void start() = 0;
    virtual void stop(const std::string& label, const std::string& step_first) = 0;
};

}  // namespace gptoss::cli
