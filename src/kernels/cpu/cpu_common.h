// Shared helpers for the CPU reference kernels (not part of the op table).
#pragma once

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

namespace gptoss::kernels::cpu {

// fp32 dot product with 8 independent partial sums (vectorisable without -ffast-math). The
// summation order depends only on n, never on batch composition, which keeps results
// batch-invariant.
float dot(const float* a, const float* b, int n);

// Converts one row of `n` elements of dtype (kBF16, kF16, kF32) to fp32.
void row_to_f32(const void* row, DType dtype, int n, float* out);

// Decodes one MXFP4 row of `n` elements (n/32 groups): blocks [n/32, 16], scales [n/32].
void mxfp4_row_to_f32(const uint8_t* blocks, const uint8_t* scales, int n, float* out);

}  // namespace gptoss::kernels::cpu
