// Random gpt-oss checkpoints in the published Hugging Face layout (MXFP4 experts, BF16 rest), for
// demos, tests and full-size benchmarks (`gptoss init-model`). Values are scaled like the test
// fixtures (MODEL.md §6): norm gains 1 + 0.2·N, biases 0.1·N, sinks N(0,1), weights N/√fan_in,
// so that biases, sinks and the SwiGLU clamp all matter.
//
// The default init (kConditioned) adds the structure a trained model has, so that a bf16 forward
// agrees with an fp32 one the way it does on a trained model (issue 5: top-1 >= 99%, last-position
// relative L2 <= 2e-2). A plain N/√fan_in model is ill-conditioned in three ways, measured with
// CpuForward fp32 vs emulate_bf16 (bench/NOTES.md, "Accuracy conditioning (session 2)"):
//  1. Near-flat next-token logits: V Gaussian logits have a top-1/top-2 gap of ~σ/√(2 ln V), so the
//     bf16 rounding of the final hidden state alone flips ~1% of argmaxes at V = 201k. Scaling the
//     lm_head does not help (gap and error scale together); a structural peak does. Here the
//     lm_head row of token v also holds the embedding of a token src(v) (src: a random permutation
//     of the vocabulary), κ = 12 times the row noise: every token predicts "its" next token with a
//     margin of several nats, like a trained model's confident top-1 (the top-1 probability is
//     above 0.3 at most positions), while the context still shapes the rest of the distribution.
//  2. Router near-ties: 32 Gaussian router logits have a 4th/5th gap of ~0.15σ, so tiny upstream
//     differences swap experts at some layer for many tokens; each swap moves the residual by a few
//     percent and the logits by up to 0.2-0.3 relative L2. Trained routers have clear margins. Here
//     every layer's router row e holds a direction d_e shared across layers, and the embedding of
//     token t holds a·d_e for experts_per_token experts S(t) picked by hashing t: the experts of
//     S(t) get a ~5σ boost (token-dependent routing, as trained MoE routers largely are), and the
//     softmax weights among them still depend on the context through the N(0,1) part.
//  3. The SwiGLU clamp (±7) was never reached with pre-activations of std ~1.3: gate_up carries a
//     gain 2 (std ~2.6, a fraction of a percent clamped) and down_proj 1/4 to keep the experts'
//     output size.
// With these, fp32 vs emulate_bf16 agree at 100% top-1 with last-position relative L2 ~2e-3 on
// 24-layer models, and removing the clamp, sinks, biases or norm gains still moves the logits by
// 10-200× that. kPlain is the previous init (weights N/√fan_in, residual-branch gain only).
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"
#include "model/gpt_oss_config.h"

namespace gptoss::model {

enum class RandomInit {
    kConditioned,  // default: peaked next-token distribution, decisive routing, active clamp (see above)
    kPlain,        // N/√fan_in weights with the residual-branch gain only (ill-conditioned for bf16 checks)
};

struct RandomCheckpointOptions {
    uint64_t seed = 0;
    uint64_t max_shard_bytes = 0;  // 0: one model.safetensors file
    RandomInit init = RandomInit::kConditioned;
};

// Writes config.json and the safetensors files into `dir` (created if needed). Deterministic for a
// given seed and init, independent of the number of threads. Streams tensor by tensor (peak memory
// = the largest tensor), with a progress bar on a terminal. The init is recorded in the safetensors
// metadata as "gptoss_init" ("conditioned-v1" or "plain").
Status write_random_checkpoint(const GptOssConfig& config, const std::string& dir,
                               const RandomCheckpointOptions& options);

}  // namespace gptoss::model
