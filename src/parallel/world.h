// Parallel layout of one replica on one node (DESIGN.md §4): W = DP × TP ranks.
//   attention: DP groups of TP ranks; a TP group splits the heads (and the lm_head vocabulary),
//              each DP group runs its own sequences;
//   MoE:       all W ranks; EP partitions the experts, and the W / EP ranks that share an expert
//              shard split its intermediate dimension (MoE-TP). With DP > 1 the DP groups' tokens are
//              gathered before the experts and the results reduced back (SGLang's DP attention).
// The account's EP4·DP1·TP4 is {tp 4, dp 1, ep 4}: heads over 4 GPUs, 8 experts per GPU.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace gptoss::parallel {

struct ParallelConfig {
    int tp = 1;  // attention tensor parallel (heads, lm_head vocabulary)
    int dp = 1;  // attention data parallel (independent batches)
    int ep = 1;  // expert parallel (divides tp · dp)

    int world_size() const { return tp * dp; }
    int moe_tp() const { return world_size() / ep; }  // ranks that split one expert's intermediate
    bool trivial() const { return world_size() == 1; }
    std::string to_string() const;  // "EP2·DP1·TP2"

    // Structural checks (positive, ep divides tp · dp). Model-specific checks live in the model.
    Status validate() const;
    // "tp=2,ep=2,dp=1" (any order, missing keys = 1) or the account's "EP2·DP1·TP2" / "ep2dp1tp2".
    static StatusOr<ParallelConfig> parse(const std::string& text);
};

// Where one rank sits in the layout.
struct RankLayout {
    int rank = 0;
    int tp_rank = 0;      // rank % tp
    int dp_rank = 0;      // rank / tp
    int ep_rank = 0;      // rank / moe_tp
    int moe_tp_rank = 0;  // rank % moe_tp
};
RankLayout rank_layout(const ParallelConfig& config, int rank);

// The ranks of each group a rank belongs to (ascending; index in the list = rank in the group).
std::vector<int> tp_group_ranks(const ParallelConfig& config, int rank);
std::vector<int> dp_group_ranks(const ParallelConfig& config, int rank);

// Contiguous split of `n` units over `parts` as vLLM does for the expert intermediate dimension:
// ceil(n / parts) units per part, the last parts taking what is left (possibly none).
// Returns [begin, end) of part `index`.
std::pair<int, int> ceil_split(int n, int parts, int index);

// Every valid {tp, dp, ep} on `world_size` ranks (tp and ep powers of two dividing the world), in a
// stable order: for the sweep.
std::vector<ParallelConfig> all_configs(int world_size);

}  // namespace gptoss::parallel
