// The FP8 quantizers' power-of-two scale from an amax's bits (kernels/fp8_scale_bits.h, used by the
// CUDA kernels) against model::fp8_block_scale, the reference arithmetic: every biased exponent with
// the mantissas around the 1.75 boundary, the ends, and random ones. (An exhaustive run over all
// 2^31 positive floats, made once while writing the header, found no difference either.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/fp8_scale_bits.h"
#include "model/fp8_convert.h"

namespace {

float from_bits(uint32_t b) {
    float f;
    std::memcpy(&f, &b, 4);
    return f;
}
uint32_t to_bits(float f) {
    uint32_t b;
    std::memcpy(&b, &f, 4);
    return b;
}

TEST(Fp8ScaleBits, MatchesTheReferenceScale) {
    std::mt19937 rng(7);
    size_t fast = 0;
    for (uint32_t sign : {0u, 1u}) {
        for (uint32_t e = 0; e <= 255; ++e) {
            std::vector<uint32_t> mantissas = {0u,        1u,        0x5ffffeu, 0x5fffffu, 0x600000u,
                                               0x600001u, 0x600002u, 0x7ffffeu, 0x7fffffu, 0x400000u};
            for (int i = 0; i < 64; ++i) mantissas.push_back(rng() & 0x7fffffu);
            for (uint32_t m : mantissas) {
                const uint32_t bits = sign << 31 | e << 23 | m;
                const float amax = from_bits(bits);
                const uint32_t se = gptoss::kernels::fp8_pow2_scale_exp(bits);
                if (se == 0) {
                    // The kernels then take the reference arithmetic: only outside positive normal
                    // amax above 2^-118.
                    EXPECT_TRUE(sign == 1 || e < 9 || e == 255) << std::hex << bits;
                    continue;
                }
                ++fast;
                const float want = gptoss::model::fp8_block_scale(amax);
                EXPECT_EQ(to_bits(want), se << 23) << "amax bits " << std::hex << bits;
                // The smallest power of two with amax <= 448 s, as the header says.
                const float s = from_bits(se << 23);
                EXPECT_LE(amax, 448.0f * s);
                EXPECT_GT(amax, 448.0f * (s * 0.5f));
                // Its inverse from the bits is 1 / s.
                const uint32_t ie = gptoss::kernels::fp8_pow2_inverse_exp(se);
                if (ie != 0) {
                    EXPECT_EQ(to_bits(1.0f / s), ie << 23) << "inverse of " << s;
                }
            }
        }
    }
    EXPECT_EQ(fast, 246u * 74u) << "the fast form applies to every positive normal amax above 2^-118";
}

}  // namespace
