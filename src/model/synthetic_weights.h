// Random gpt-oss weights built directly in host memory, for benchmarks of models whose checkpoint
// would not fit the disk at hand (gpt-oss-120b's 65 GB on a 64 GB scratch disk): `gptoss bench
// --synthetic gpt-oss-120b`. Same tensors, shapes and formats as a loaded MXFP4 checkpoint (bf16
// dense weights, MXFP4 experts); values are random with sane scales (weights ~ 1/√fan_in, norms
// 1, small biases), not the conditioned init of random_checkpoint.h: for speed, not accuracy.
#pragma once

#include <cstdint>
#include <memory>

#include "core/status.h"
#include "model/gpt_oss_weights.h"

namespace gptoss::model {

StatusOr<std::unique_ptr<GptOssWeights>> make_synthetic_weights(const GptOssConfig& config, uint64_t seed);

// Host bytes make_synthetic_weights allocates for `config` (gpt-oss-120b: ~65 GB), for a check against the
// machine's memory before building them.
uint64_t synthetic_weight_bytes(const GptOssConfig& config);

}  // namespace gptoss::model
