#include "kernels/cpu/cpu_common.h"

#include <array>
#include <cmath>

#include "core/check.h"

namespace gptoss::kernels::cpu {
namespace {

struct Mxfp4Tables {
    std::array<std::array<float, 2>, 256> pairs;  // byte -> {low nibble value, high nibble value}
    std::array<float, 256> scales;                // e8m0 byte -> 2^(s-127)
    Mxfp4Tables() {
        for (int b = 0; b < 256; ++b) pairs[b] = {e2m1_to_f32(b & 0x0f), e2m1_to_f32(b >> 4)};
        for (int s = 0; s < 256; ++s) scales[s] = e8m0_to_f32(static_cast<uint8_t>(s));
    }
};

const Mxfp4Tables& mxfp4_tables() {
    static const Mxfp4Tables t;
    return t;
}

}  // namespace

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("arch=x86-64-v3", "default")))
#endif
float dot(const float* a, const float* b, int n) {
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
    }
    float tail = 0.0f;
    for (; i < n; ++i) tail += a[i] * b[i];
    return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail;
}

void row_to_f32(const void* row, DType dtype, int n, float* out) {
    switch (dtype) {
        case DType::kF32: std::memcpy(out, row, sizeof(float) * n); return;
        case DType::kBF16: {
            const uint16_t* r = static_cast<const uint16_t*>(row);
            for (int i = 0; i < n; ++i) out[i] = bf16_to_f32(r[i]);
            return;
        }
        case DType::kF16: {
            const uint16_t* r = static_cast<const uint16_t*>(row);
            for (int i = 0; i < n; ++i) out[i] = f16_to_f32(r[i]);
            return;
        }
        case DType::kFP8E4M3:
        case DType::kU8:
        case DType::kI32:
        case DType::kI64: break;
    }
    ENGINE_UNREACHABLE("row_to_f32: unsupported dtype %d", static_cast<int>(dtype));
}

void mxfp4_row_to_f32(const uint8_t* blocks, const uint8_t* scales, int n, float* out) {
    const Mxfp4Tables& t = mxfp4_tables();
    const int groups = n / kMxfp4GroupSize;
    for (int g = 0; g < groups; ++g) {
        const float s = t.scales[scales[g]];
        const uint8_t* b = blocks + g * kMxfp4BytesPerGroup;
        float* o = out + g * kMxfp4GroupSize;
        for (int j = 0; j < kMxfp4BytesPerGroup; ++j) {
            const auto& p = t.pairs[b[j]];
            o[2 * j] = p[0] * s;  // exact: ≤ 2 significant bits times a power of two
            o[2 * j + 1] = p[1] * s;
        }
    }
}

}  // namespace gptoss::kernels::cpu
