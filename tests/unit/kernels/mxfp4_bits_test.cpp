// The e2m1 -> bf16 bit tricks of the CUDA MoE kernels (kernels/mxfp4_bits.h), checked on the host
// against the MXFP4 definition: every code, in every position of a word, must come out as the
// bf16 pattern of its value times 2^-126, exactly (the kernels then multiply by 2^(scale - 1)).
#include "kernels/mxfp4_bits.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace gptoss::kernels {
namespace {

// e2m1 by its definition (OCP MX spec): sign, 2 exponent bits (bias 1), 1 mantissa bit; exponent 0
// is subnormal (0 or 0.5).
float e2m1_value(uint32_t code) {
    const uint32_t e = (code >> 1) & 3, m = code & 1;
    const float mag = e == 0 ? 0.5f * static_cast<float>(m) : std::ldexp(1.0f + 0.5f * static_cast<float>(m), e - 1);
    return (code & 8) ? -mag : mag;
}

// The value of a bf16 bit pattern, times 2^126.
float bf16_times_2_126(uint32_t bits16) {
    const uint32_t f = bits16 << 16;
    float v;
    std::memcpy(&v, &f, 4);
    return std::ldexp(v, 126);
}

TEST(Mxfp4Bits, PairFromByteIsExact) {
    for (uint32_t b = 0; b < 256; ++b) {
        const uint32_t r = e2m1x2_raw(b);
        EXPECT_EQ(bf16_times_2_126(r & 0xffffu), e2m1_value(b & 15)) << "byte " << b << " low";
        EXPECT_EQ(bf16_times_2_126(r >> 16), e2m1_value(b >> 4)) << "byte " << b << " high";
        // Only sign, exponent bits 1:0 and the top mantissa bit may be set: nothing else leaks.
        EXPECT_EQ(r & ~0x81C081C0u, 0u) << "byte " << b;
    }
}

// Register i of e2m1x8_raw holds code i (low half) and code i + 4 (high half) of the word.
void check_word(uint32_t w) {
    uint32_t r[4];
    e2m1x8_raw(w, r);
    for (int i = 0; i < 4; ++i) {
        const uint32_t lo = (w >> (4 * i)) & 15, hi = (w >> (4 * (i + 4))) & 15;
        ASSERT_EQ(bf16_times_2_126(r[i] & 0xffffu), e2m1_value(lo)) << std::hex << "word 0x" << w << " reg " << i;
        ASSERT_EQ(bf16_times_2_126(r[i] >> 16), e2m1_value(hi)) << std::hex << "word 0x" << w << " reg " << i;
        ASSERT_EQ(r[i] & ~0x81C081C0u, 0u) << std::hex << "word 0x" << w << " reg " << i;
    }
}

TEST(Mxfp4Bits, EightCodesFromWordAreExactAndPaired) {
    // Every code alone in every position, every code next to all-ones neighbours (carries and
    // leaks between fields would show there), then random words.
    for (uint32_t code = 0; code < 16; ++code)
        for (int pos = 0; pos < 8; ++pos) {
            check_word(code << (4 * pos));
            check_word((0xFFFFFFFFu & ~(15u << (4 * pos))) | (code << (4 * pos)));
        }
    std::mt19937 rng(5);
    for (int n = 0; n < 200000; ++n) check_word(rng());
}

}  // namespace
}  // namespace gptoss::kernels
