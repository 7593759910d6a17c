// The FP8 quantizers' power-of-two scale from an amax's bits, checked on the host against
// model::fp8_block_scale (tests/unit/model/fp8_scale_bits_test.cpp). The CUDA kernels'
// fp8_pow2_scale (kernels/cuda/fp8_quant.cuh) and the 1 / s after it take it (bench/NOTES.md r35
// item 8, r36).
//
// fp8_block_scale(amax) is the smallest 2^j with amax ≤ 448 · 2^j (its division and frexp / ldexp
// land there for every finite amax > 0: an exhaustive check over all 2^31 positive floats found no
// exception where the fast form applies). With amax = m · 2^(E - 127), m in [1, 2), and 448 = 1.75 ·
// 2^8: j = E - 127 - 8 when m ≤ 1.75 (mantissa bits ≤ 0x600000), one more above. Integer operations
// only, where the kernels spend two IEEE divisions, frexp and ldexp a group (r35: the prompt
// attention's epilogue, on every query tile's path).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gptoss::kernels {

// The biased exponent of fp8_block_scale(amax) from amax's bits, for a positive normal amax with
// biased exponent 9..254 (the scale then normal); 0 otherwise (negative, zero, subnormal, tiny, inf,
// NaN: the caller takes the reference arithmetic).
GPTOSS_HOST_DEVICE uint32_t fp8_pow2_scale_exp(uint32_t amax_bits) {
    const uint32_t e = amax_bits >> 23, m = amax_bits & 0x7fffffu;  // e ≥ 256 when the sign is set
    if (e < 9u || e > 254u) return 0u;
    return e - 8u + (m > 0x600000u ? 1u : 0u);
}

// The biased exponent of 1 / s for a power of two s with biased exponent se in 1..253 (exact:
// 2^(127 - (se - 127))); 0 otherwise.
GPTOSS_HOST_DEVICE uint32_t fp8_pow2_inverse_exp(uint32_t se) { return se >= 1u && se <= 253u ? 254u - se : 0u; }

}  // namespace gptoss::kernels
