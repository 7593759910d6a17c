// NCCL communicators for the ranks of one process (one GPU and one worker thread per rank).
// libnccl.so.2 is loaded at run time (dlopen), so builds need only nccl.h and hosts without NCCL
// still run everything else: $GPTOSS_NCCL_LIBRARY names the library file, else the dynamic
// loader's search path is used (a Python install's nvidia/nccl/lib works).
// Keep NVLink SHARP/multicast off on shared hosts (NCCL_NVLS_ENABLE=0): make_nccl_world sets it
// unless the environment already does.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/world.h"

namespace gptoss::parallel {

// True when this build has NCCL support and the library loads; otherwise `why` says what is missing.
bool nccl_available(std::string* why = nullptr);

// World, TP and DP communicators for every rank (index = rank) on devices[rank]. Collectives take
// device pointers and a cudaStream_t; they may be captured in CUDA graphs.
StatusOr<std::vector<RankComms>> make_nccl_world(const ParallelConfig& config, std::span<const int> devices);

}  // namespace gptoss::parallel
