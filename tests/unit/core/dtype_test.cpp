#include "core/dtype.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace gptoss {
namespace {

uint32_t bits_of(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    return u;
}

// MXFP4: all 16 codes x all 256 scales, bit-exact against FP4 table x ldexp (MODEL.md §3).
TEST(Mxfp4, AllCodesAllScalesBitExact) {
    static const double kTable[16] = {0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6};
    for (int s = 0; s < 256; ++s) {
        for (int c = 0; c < 16; ++c) {
            float expect = static_cast<float>(std::ldexp(kTable[c], s - 127));
            float got = mxfp4_value(static_cast<uint8_t>(c), static_cast<uint8_t>(s));
            ASSERT_EQ(bits_of(got), bits_of(expect)) << "code " << c << " scale " << s;
        }
    }
}

TEST(Mxfp4, WorkedExampleFromSpec) {
    // Bytes 2F 91 70 08 with scale 0x7E decode to [-3, 0.5, 0.25, -0.25, 0, 3, -0, 0].
    const uint8_t bytes[4] = {0x2F, 0x91, 0x70, 0x08};
    const float expect[8] = {-3.0f, 0.5f, 0.25f, -0.25f, 0.0f, 3.0f, -0.0f, 0.0f};
    for (int b = 0; b < 4; ++b) {
        EXPECT_EQ(bits_of(mxfp4_value(bytes[b] & 0x0f, 0x7e)), bits_of(expect[2 * b]));
        EXPECT_EQ(bits_of(mxfp4_value(bytes[b] >> 4, 0x7e)), bits_of(expect[2 * b + 1]));
    }
}

TEST(Bf16, RoundTripAndRounding) {
    for (uint32_t h = 0; h < 65536; ++h) {
        float f = bf16_to_f32(static_cast<uint16_t>(h));
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_bf16(f), h);
    }
    // Ties go to even: 1 + 2^-8 is halfway between 1 and 1 + 2^-7.
    EXPECT_EQ(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
    EXPECT_EQ(f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
    EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::nanf("")))));
}

TEST(Fp8E4M3, DecodeTable) {
    EXPECT_EQ(fp8e4m3_to_f32(0x7e), 448.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0xfe), -448.0f);
    EXPECT_EQ(fp8e4m3_to_f32(0x01), std::ldexp(1.0f, -9));  // smallest subnormal
    EXPECT_EQ(fp8e4m3_to_f32(0x08), std::ldexp(1.0f, -6));  // smallest normal
    EXPECT_EQ(fp8e4m3_to_f32(0x38), 1.0f);
    EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0x7f)));
    EXPECT_TRUE(std::isnan(fp8e4m3_to_f32(0xff)));
}

TEST(Fp8E4M3, EncodeRoundTripsEveryValue) {
    for (int b = 0; b < 256; ++b) {
        float f = fp8e4m3_to_f32(static_cast<uint8_t>(b));
        if (std::isnan(f)) continue;
        ASSERT_EQ(f32_to_fp8e4m3(f), b) << f;
    }
}

// Against a brute-force nearest-even search over all finite codes.
TEST(Fp8E4M3, EncodeMatchesBruteForceNearestEven) {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> mag(-12.0f, 10.0f);
    for (int i = 0; i < 200000; ++i) {
        float f = std::ldexp(1.0f, 0) * std::exp2(mag(rng)) * ((rng() & 1) ? -1.f : 1.f);
        if (i % 7 == 0) f = fp8e4m3_to_f32(rng() & 0x7e) * 1.0625f;  // near midpoints
        uint8_t got = f32_to_fp8e4m3(f);
        double best_err = 1e300;
        int best = -1;
        for (int b = 0; b < 256; ++b) {
            float v = fp8e4m3_to_f32(static_cast<uint8_t>(b));
            if (std::isnan(v) || std::signbit(v) != std::signbit(f)) continue;
            double err = std::fabs(static_cast<double>(v) - f);
            bool even = (b & 1) == 0;
            if (err < best_err || (err == best_err && even)) {
                best_err = err;
                best = b;
            }
        }
        if (std::fabs(f) >= 448.0f) best = std::signbit(f) ? 0xfe : 0x7e;  // saturation
        ASSERT_EQ(got, best) << "f=" << f;
    }
    EXPECT_EQ(f32_to_fp8e4m3(1e9f), 0x7e);
    EXPECT_EQ(f32_to_fp8e4m3(-1e9f), 0xfe);
    EXPECT_EQ(f32_to_fp8e4m3(INFINITY), 0x7e);
    EXPECT_EQ(f32_to_fp8e4m3(std::nanf("")), 0x7f);
}

TEST(F16, Decode) {
    EXPECT_EQ(f16_to_f32(0x3c00), 1.0f);
    EXPECT_EQ(f16_to_f32(0xc000), -2.0f);
    EXPECT_EQ(f16_to_f32(0x0001), std::ldexp(1.0f, -24));
    EXPECT_EQ(f16_to_f32(0x7bff), 65504.0f);
    EXPECT_TRUE(std::isinf(f16_to_f32(0x7c00)));
}

}  // namespace
}  // namespace gptoss
