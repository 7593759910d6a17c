// MXFP4 (e2m1) codes to bf16 bit patterns with integer operations only, shared by the CUDA MoE
// kernels and testable on the host (tests/unit/kernels/mxfp4_bits_test.cpp).
//
// An e2m1 code s·e1·e0·m becomes a bf16 whose sign is s, whose exponent's low two bits are e1 e0 and
// whose top mantissa bit is m: that bf16 is the e2m1 value times 2^-126, subnormals included (code
// 1, 0.5, lands on the bf16 subnormal 2^-127). One bf16 multiply by 2^(scale - 1) then applies both
// the 2^126 and the MXFP4 group scale 2^(scale - 127).
#pragma once

#include <cstdint>

#include "kernels/host_device.h"

namespace gptoss::kernels {

// Two e2m1 codes (byte b, bits above 7 zero; low nibble -> low half) as bf16x2 bit patterns worth
// value · 2^-126. Two multiplies place both nibbles at once: b · (2^6 + 2^18) puts magnitude bits
// 2:0 at 8:6 and 6:4 at 24:22 (the other copies land outside the mask), b · (2^12 + 2^24) the sign
// bits 3 and 7 at 15 and 31. Four integer ops for two weights.
GPTOSS_HOST_DEVICE uint32_t e2m1x2_raw(uint32_t b) {
    return ((b * 0x00040040u) & 0x01C001C0u) | ((b * 0x01001000u) & 0x80008000u);
}

// Four bf16x2 bit patterns (value · 2^-126) from one word of 8 e2m1 codes (code i at bits
// 4i..4i+3): r[i] holds code i (low half) and code i + 4 (high half). u = w & 0x000F000F puts codes
// 0 and 4 at bits 0-3 and 16-19; u · (2^6 + 2^12) copies them to 6-9 / 22-25 and 12-15 / 28-31
// without overlap (no carries), and the mask keeps the magnitudes at 8:6 (24:22) and the signs at
// 15 (31). Codes 1 and 5 take 2^2 + 2^8; codes 2, 3, 6, 7 the same from w >> 8. Three integer ops
// per two weights (plus one shift per word).
GPTOSS_HOST_DEVICE void e2m1x8_raw(uint32_t w, uint32_t (&r)[4]) {
    const uint32_t hi = w >> 8;
    r[0] = ((w & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
    r[1] = ((w & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
    r[2] = ((hi & 0x000F000Fu) * 0x1040u) & 0x81C081C0u;
    r[3] = ((hi & 0x00F000F0u) * 0x0104u) & 0x81C081C0u;
}

// The decode layout's words (moe_pack_decode, kernels/cuda/moe.h) hold the same 8 codes with their 32 bits
// permuted so that e2m1x8_raw's four registers take 8 integer ops instead of 13: each register's two codes sit
// where one rotation (or none) and the mask 0x81C081C0 put them, but for the last pair, which no rotation can
// place beside the other three (no four translates of a pair's bit set tile a 16-bit half) and which takes the
// multiply-and-mask form with three shifts at once. Register j = rotr(w, 3j) & mask for j < 3, and
// ((w & 0x001B001B) · (2^3 + 2^8 + 2^14)) & mask for j = 3 (the three shifted copies of its 8 bits do not overlap,
// so the product carries nowhere). Session 69; the count in bench/NOTES.md r81.
//
// A published word (code i at bits 4i..4i + 3) in the decode layout's bit order: bit b (0 m, 1 e0, 2 e1, 3 s) of
// code i goes to kPos[i][b]. For the pack kernel and the tests.
GPTOSS_HOST_DEVICE uint32_t e2m1x8_to_decode_bits(uint32_t w) {
    constexpr int kPos[8][4] = {
        {6, 7, 8, 15},     // code 0: register 0, low half, in place
        {9, 10, 11, 18},   // code 1: register 1 (rotr 3), low half
        {12, 13, 14, 21},  // code 2: register 2 (rotr 6), low half
        {3, 4, 0, 1},      // code 3: register 3 (multiply), low half
        {22, 23, 24, 31},  // code 4: register 0, high half
        {25, 26, 27, 2},   // code 5: register 1, high half (its sign wraps round to bit 31)
        {28, 29, 30, 5},   // code 6: register 2, high half (the same)
        {19, 20, 16, 17},  // code 7: register 3, high half
    };
    uint32_t out = 0;
    for (int i = 0; i < 8; ++i)
        for (int b = 0; b < 4; ++b) out |= ((w >> (4 * i + b)) & 1u) << kPos[i][b];
    return out;
}

GPTOSS_HOST_DEVICE uint32_t rotr32(uint32_t w, int k) {
#if defined(__CUDA_ARCH__)
    return __funnelshift_r(w, w, k);
#else
    return (w >> k) | (w << ((32 - k) & 31));
#endif
}

// e2m1x8_raw's four registers from a word in the decode layout's bit order (e2m1x8_to_decode_bits): the same
// bits as e2m1x8_raw of the published word.
GPTOSS_HOST_DEVICE void e2m1x8_raw_decode_bits(uint32_t w, uint32_t (&r)[4]) {
    r[0] = w & 0x81C081C0u;
    r[1] = rotr32(w, 3) & 0x81C081C0u;
    r[2] = rotr32(w, 6) & 0x81C081C0u;
    r[3] = ((w & 0x001B001Bu) * 0x4108u) & 0x81C081C0u;
}

}  // namespace gptoss::kernels
