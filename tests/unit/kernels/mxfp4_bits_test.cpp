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

// The decode layout's bit order (e2m1x8_to_decode_bits) is a permutation of the word's 32 bits.
TEST(Mxfp4Bits, DecodeBitOrderIsAPermutation) {
    uint32_t seen = 0;
    for (int b = 0; b < 32; ++b) {
        const uint32_t out = e2m1x8_to_decode_bits(1u << b);
        ASSERT_NE(out, 0u) << "bit " << b << " dropped";
        ASSERT_EQ(out & (out - 1), 0u) << "bit " << b << " copied";
        ASSERT_EQ(seen & out, 0u) << "bit " << b << " lands on another's place";
        seen |= out;
    }
    EXPECT_EQ(seen, 0xFFFFFFFFu);
}

// e2m1x8_raw_decode_bits of a word in the decode layout's bit order gives e2m1x8_raw of the published word: the
// same four registers, bit for bit (so the same exact values), on the words check_word uses.
void check_decode_bits(uint32_t w) {
    uint32_t want[4], got[4];
    e2m1x8_raw(w, want);
    e2m1x8_raw_decode_bits(e2m1x8_to_decode_bits(w), got);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(got[i], want[i]) << std::hex << "word 0x" << w << " reg " << i;
}

TEST(Mxfp4Bits, DecodeBitOrderGivesTheSameRegisters) {
    for (uint32_t code = 0; code < 16; ++code)
        for (int pos = 0; pos < 8; ++pos) {
            check_decode_bits(code << (4 * pos));
            check_decode_bits((0xFFFFFFFFu & ~(15u << (4 * pos))) | (code << (4 * pos)));
        }
    // Every pair of codes in registers 3's two places (the multiply's copies are where carries would show).
    for (uint32_t lo = 0; lo < 16; ++lo)
        for (uint32_t hi = 0; hi < 16; ++hi) {
            check_decode_bits((lo << 12) | (hi << 28));
            check_decode_bits(0x0FFF0FFFu | (lo << 12) | (hi << 28));
        }
    std::mt19937 rng(6);
    for (int n = 0; n < 200000; ++n) check_decode_bits(rng());
}

}  // namespace
}  // namespace gptoss::kernels
