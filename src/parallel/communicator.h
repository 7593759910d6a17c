// Collectives over a group of ranks. One Communicator object per rank and group; every rank of the
// group must make the same calls in the same order with the same sizes (as with NCCL).
// Host communicators (LocalGroup: ranks as threads of one process, for the CPU backend and CI)
// take host pointers and ignore `stream`; NCCL communicators take device pointers and enqueue on
// `stream` (a cudaStream_t), returning before the data moves.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace gptoss::parallel {

class Communicator {
public:
    virtual ~Communicator() = default;
    virtual int rank() const = 0;  // in this group
    virtual int size() const = 0;

    // data[0, count) summed over the group, in place. dtype: kF32 or kBF16 (summed in fp32 on host).
    virtual Status all_reduce_sum(void* data, size_t count, DType dtype, void* stream = nullptr) = 0;
    // recv[r·count, (r+1)·count) = rank r's send[0, count).
    virtual Status all_gather(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) = 0;
    // recv[0, count) = Σ_r rank r's send[rank()·count, (rank()+1)·count).
    virtual Status reduce_scatter_sum(const void* send, void* recv, size_t count, DType dtype,
                                      void* stream = nullptr) = 0;
    // recv[r·count, (r+1)·count) = rank r's send[rank()·count, (rank()+1)·count).
    virtual Status all_to_all(const void* send, void* recv, size_t count, DType dtype, void* stream = nullptr) = 0;
    // data[0, bytes) of `root` copied to every rank.
    virtual Status broadcast(void* data, size_t bytes, int root, void* stream = nullptr) = 0;
};

// The communicators one rank holds. For a world of one rank they are all trivial (size 1).
struct RankComms {
    int rank = 0;
    std::unique_ptr<Communicator> world;  // all ranks (MoE reduction)
    std::unique_ptr<Communicator> tp;     // this rank's TP group (attention, lm_head)
    std::unique_ptr<Communicator> dp;     // this rank's DP group (token gather before the experts)
};

// Bytes per element of the dtypes collectives accept (0 for others).
size_t collective_dtype_bytes(DType dtype);

}  // namespace gptoss::parallel
