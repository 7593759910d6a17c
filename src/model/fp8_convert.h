// FP8 experts: the on-disk format "gptoss_fp8_block" version 1 and the converter that writes it
// (`gptoss convert --model DIR --to fp8 --out DIR2`).
//
// Format (a Hugging Face-style directory; everything not listed is copied unchanged, bf16):
//   config.json: the source config with quantization_config = {"quant_method": "gptoss_fp8_block",
//     "format_version": 1, "weight_block_size": [128, 128], "modules_to_not_convert": [...]}
//   model.layers.N.mlp.experts.gate_up_proj_fp8        F8_E4M3 [E, 2I, H]  [out, in], rows interleaved
//                                                                          as published (even = gate)
//   model.layers.N.mlp.experts.gate_up_proj_fp8_scale  F32     [E, ⌈2I/128⌉, ⌈H/128⌉]
//   model.layers.N.mlp.experts.down_proj_fp8           F8_E4M3 [E, H, I]
//   model.layers.N.mlp.experts.down_proj_fp8_scale     F32     [E, ⌈H/128⌉, ⌈I/128⌉]
//   (biases keep their names and bf16 storage)
//   With --dense (quantization_config "dense_fp8": true), also every attention projection and an
//   untied lm_head, in place of its bf16 tensor:
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight_fp8       F8_E4M3 [out, in]
//   model.layers.N.self_attn.{q,k,v,o}_proj.weight_fp8_scale F32     [⌈out/128⌉, ⌈in/128⌉]
//   lm_head.weight_fp8 / lm_head.weight_fp8_scale            likewise ([vocab, hidden])
//   Readers dequantize them to bf16 at load (exact); the CUDA backend's --fp8 requantizes them to
//   the same bytes (same block rule), so converting offline only saves disk and load time. Lossy
//   (bf16 → e4m3): a few percent on the logits, as --fp8.
// w[e, r, c] ≈ fp8(q[e, r, c]) · scale[e, r / 128, c / 128].
//
// Partial blocks: 2880 = 22·128 + 64, so the last block row and column of every matrix are 64 wide.
// They are stored as they are (no padding on disk); their scale comes from the elements present.
// Kernels that need K to be a multiple of 128 pad at load time (zeros, which quantize exactly).
//
// Scales are powers of two, the smallest with amax / scale ≤ 448. MXFP4 weights are
// e2m1 (1 mantissa bit) times a power-of-two group scale, so dividing them by a power of two is
// exact in e4m3 (3 mantissa bits) as long as the result stays in e4m3's range: conversion from
// the published MXFP4 checkpoint is lossless except for values more than 2^-9 / 448 below their
// block's maximum, which flush towards zero (a group scale 2^15 smaller than the block's largest).
// Scales are at least 2^-126 (kFp8MinScale, the smallest normal float), so that 1 / s is finite: a
// block whose largest magnitude is below 448 · 2^-126 keeps that scale, and its values below 2^-135
// (e4m3's smallest subnormal at that scale) flush to zero.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace gptoss::model {

inline constexpr int kFp8Block = 128;
inline constexpr float kFp8MinScale = 0x1p-126f;  // the smallest block scale (see above)
inline constexpr int kFp8FormatVersion = 1;
inline constexpr const char* kFp8QuantMethod = "gptoss_fp8_block";

// The power-of-two scale for a block whose largest magnitude is `amax` (1 for an all-zero block).
float fp8_block_scale(float amax);

// Quantizes a row-major [rows, cols] fp32 matrix: q [rows, cols] e4m3 bytes, scales
// [⌈rows/128⌉, ⌈cols/128⌉].
void quantize_fp8_blocks(const float* w, int rows, int cols, uint8_t* q, float* scales);

// Writes `out_dir` in the format above from a gpt-oss checkpoint in either published layout;
// `dense`: the attention and lm_head weights too.
Status convert_to_fp8(const std::string& in_dir, const std::string& out_dir, bool dense = false);

}  // namespace gptoss::model
