// One-shot all-reduce over peer access (NVLink) for the small per-layer reductions of decode
// (issue 7), where NCCL's launch and ring latency cost about what tensor parallelism saves (r18:
// TP2 batch-1 decode 2.71 vs 2.93 ms on one GPU).
//
// One kernel of one CTA per rank and call: the rank copies its data into its own staging buffer,
// stores a flag (the call's epoch) into every rank's flag array, waits until every rank's flag for
// this epoch is in its own array, then sums the ranks' staging buffers, read over peer access, in
// rank order, so that every rank gets the same bits. Two staging buffers alternate by epoch: a
// rank can only reuse a buffer after every peer has flagged the next call, which each peer does
// only after it finished reading this one. The epoch lives in device memory and advances in the
// kernel, so the calls can be captured in CUDA graphs. A rank that waits more than ~10 s traps
// (a launch error) instead of hanging.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "core/status.h"
#include "kernels/cuda/device_buffer.h"

namespace gptoss::kernels::cuda {

class PeerAllReduce {
public:
    // One object per rank of a group; devices[i] is rank i's device. Enables peer access between
    // every pair (kUnimplemented if some pair has none). Buffers for up to max_floats values.
    static StatusOr<std::vector<std::unique_ptr<PeerAllReduce>>> create_group(std::span<const int> devices,
                                                                              size_t max_floats);

    int rank() const { return rank_; }
    int size() const { return size_; }
    size_t max_floats() const { return max_floats_; }
    // data[0, count) (fp32, on this rank's device) summed over the group in place, on `stream`.
    // Every rank must make the same calls in the same order. count ≤ max_floats().
    void all_reduce_f32(float* data, size_t count, cudaStream_t stream);

private:
    PeerAllReduce() = default;
    int rank_ = 0, size_ = 1, device_ = 0;
    size_t max_floats_ = 0;
    DeviceBuffer staging_;       // [2][max_floats] f32
    DeviceBuffer flags_;         // [2][size] u32, written by every rank
    DeviceBuffer epoch_;         // [1] u32, this rank's call count
    DeviceBuffer peer_staging_;  // [size] float*: every rank's staging_
    DeviceBuffer peer_flags_;    // [size] uint32_t*: every rank's flags_
};

}  // namespace gptoss::kernels::cuda
