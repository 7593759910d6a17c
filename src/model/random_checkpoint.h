// Random gpt-oss checkpoints in the published Hugging Face layout (MXFP4 experts, BF16 rest), for
// demos, tests and full-size benchmarks (`gptoss init-model`). Values are scaled like the test
// fixtures (MODEL.md §6): norm gains 1 + 0.2·N, biases 0.1·N, sinks N(0,1), weights N/√fan_in,
// so that biases, sinks and the SwiGLU clamp all matter.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/gpt_oss_config.h"

namespace gptoss::model {

struct RandomCheckpointOptions {
    uint64_t seed = 0;
    uint64_t max_shard_bytes = 0;  // 0: one model.safetensors file
};

// Writes config.json and the safetensors files into `dir` (created if needed). Deterministic for a
// given seed, independent of the number of threads. Streams tensor by tensor (peak memory = the
// largest tensor), with a progress bar on a terminal.
Status write_random_checkpoint(const GptOssConfig& config, const std::string& dir,
                               const RandomCheckpointOptions& options);

}  // namespace gptoss::model
