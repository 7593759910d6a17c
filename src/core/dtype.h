// Element types and their scalar conversions. Host-side reference conversions; CUDA code keeps
// its own intrinsics but must agree bit for bit (tested).
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace gptoss {

enum class DType {
    kF32,
    kBF16,
    kF16,
    kFP8E4M3,  // OCP e4m3fn: bias 7, max 448, no infinities, NaN = S.1111.111
    kU8,       // raw bytes: packed e2m1 pairs (MXFP4 blocks) or e8m0 scales
    kI32,
    kI64,
};

std::string_view dtype_name(DType dtype);
size_t dtype_size(DType dtype);

// ---- bf16 -------------------------------------------------------------------------------------
struct bf16 {
    uint16_t bits;
};

inline float bf16_to_f32(uint16_t bits) {
    uint32_t u = static_cast<uint32_t>(bits) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
    uint32_t rounding = 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>((u + rounding) >> 16);
}

// ---- fp16 (IEEE half), for reading F16 checkpoints ---------------------------------------------
float f16_to_f32(uint16_t bits);

// ---- fp8 e4m3 (OCP "e4m3fn") ------------------------------------------------------------------
constexpr float kFp8E4M3Max = 448.0f;
float fp8e4m3_to_f32(uint8_t bits);
// Round to nearest even, saturating to ±448 (as cvt.rn.satfinite does); NaN -> 0x7f.
uint8_t f32_to_fp8e4m3(float f);

// ---- MXFP4: e2m1 codes with an e8m0 scale per 32 elements --------------------------------------
// Code layout: bit 3 sign, bits 2..1 exponent (bias 1), bit 0 mantissa.
inline constexpr float kE2M1Values[16] = {+0.0f, +0.5f, +1.0f, +1.5f, +2.0f, +3.0f, +4.0f, +6.0f,
                                          -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
constexpr int kMxfp4GroupSize = 32;      // elements per scale
constexpr int kMxfp4BytesPerGroup = 16;  // two codes per byte

inline float e2m1_to_f32(uint8_t code) { return kE2M1Values[code & 0x0f]; }
// E8M0 scale byte s means 2^(s-127). s = 255 is NaN in the OCP spec; the reference implementations
// use ldexp without special-casing it, and so do we (it gives inf or 0*inf = nan, never seen in
// real checkpoints).
inline float e8m0_to_f32(uint8_t s) { return std::ldexp(1.0f, static_cast<int>(s) - 127); }
inline float mxfp4_value(uint8_t code, uint8_t scale) {
    return std::ldexp(e2m1_to_f32(code), static_cast<int>(scale) - 127);
}

}  // namespace gptoss
