// Ranks as threads of one process, exchanging through shared host memory: the simulated
// communicator the CPU backend and CI use to test every parallel layout without GPUs.
// Reductions sum in rank order on every rank, so all ranks get bit-identical results.
#pragma once

#include <memory>
#include <vector>

#include "parallel/communicator.h"
#include "parallel/world.h"

namespace gptoss::parallel {

// A group of `size` ranks; communicator(r) is rank r's handle (each handle used by one thread).
class LocalGroup {
public:
    explicit LocalGroup(int size);
    ~LocalGroup();
    std::unique_ptr<Communicator> communicator(int rank);
    int size() const;

    struct State;

private:
    std::shared_ptr<State> state_;
};

// World, TP and DP groups for every rank of `config` (index = rank).
std::vector<RankComms> make_local_world(const ParallelConfig& config);

}  // namespace gptoss::parallel
