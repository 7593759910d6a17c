#include "core/dtype.h"

namespace gptoss {

std::string_view dtype_name(DType dtype) {
    switch (dtype) {
        case DType::kF32: return "F32";
        case DType::kBF16: return "BF16";
        case DType::kF16: return "F16";
        case DType::kFP8E4M3: return "F8_E4M3";
        case DType::kU8: return "U8";
        case DType::kI32: return "I32";
        case DType::kI64: return "I64";
    }
    return "?";
}

size_t dtype_size(DType dtype) {
    switch (dtype) {
        case DType::kF32: return 4;
        case DType::kBF16: return 2;
        case DType::kF16: return 2;
        case DType::kFP8E4M3: return 1;
        case DType::kU8: return 1;
        case DType::kI32: return 4;
        case DType::kI64: return 8;
    }
    return 0;
}

float f16_to_f32(uint16_t h) {
    uint32_t sign = (h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    uint32_t u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else {  // subnormal: renormalise
            int e = -1;
            do {
                ++e;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            u = sign | (static_cast<uint32_t>(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    std::memcpy(&f, &u, 4);
    return f;
}

float fp8e4m3_to_f32(uint8_t bits) {
    uint32_t sign = bits >> 7;
    uint32_t exp = (bits >> 3) & 0xfu;
    uint32_t mant = bits & 0x7u;
    float mag;
    if (exp == 0xf && mant == 0x7) return std::nanf("");
    if (exp == 0) {
        mag = std::ldexp(static_cast<float>(mant), -9);  // subnormal: mant/8 * 2^-6
    } else {
        mag = std::ldexp(1.0f + static_cast<float>(mant) / 8.0f, static_cast<int>(exp) - 7);
    }
    return sign ? -mag : mag;
}

uint8_t f32_to_fp8e4m3(float f) {
    if (std::isnan(f)) return 0x7f;
    uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
    float a = std::fabs(f);
    if (a >= kFp8E4M3Max) return sign | 0x7e;  // saturate (inf too)
    // Find the representable neighbours by exhaustive structure: values are m * 2^(e-10) for the
    // 4-bit significand grid. Scale so the ULP for |a| is 1, round to nearest even, scale back.
    int exp;
    std::frexp(a, &exp);                   // a = fr * 2^exp, fr in [0.5, 1)
    int e_unbiased = exp - 1;              // a in [2^e, 2^(e+1))
    if (e_unbiased < -6) e_unbiased = -6;  // subnormal range shares the ULP of the smallest normal
    float ulp = std::ldexp(1.0f, e_unbiased - 3);
    float q = a / ulp;            // exact: a power-of-two scaling
    float r = std::nearbyint(q);  // default rounding mode is to nearest even
    float v = r * ulp;
    if (v > kFp8E4M3Max) v = kFp8E4M3Max;
    // Encode v.
    if (v == 0.0f) return sign;
    int ve;
    std::frexp(v, &ve);
    int e = ve - 1;
    if (e < -6) {  // subnormal
        int m = static_cast<int>(std::ldexp(v, 9));
        return sign | static_cast<uint8_t>(m);
    }
    int m = static_cast<int>(std::ldexp(v, 3 - e)) - 8;
    return sign | static_cast<uint8_t>(((e + 7) << 3) | m);
}

}  // namespace gptoss
