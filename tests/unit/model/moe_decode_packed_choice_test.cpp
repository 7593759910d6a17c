// CudaModelOptions::moe_decode_packed's decision (model/cuda_model.h moe_decode_packed_choice): unasked, the
// decode-layout copy is made only where it is at most an eighth of the GPU's memory; asked, wherever the load fits;
// refused, never; and never where the load would not fit.
#include <gtest/gtest.h>

#include "model/cuda_model.h"

namespace gptoss::model {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

TEST(MoeDecodePackedChoice, UnaskedOnlyForASmallCopy) {
    // 20b: a 12.4 GB copy. An H200 (141 GB, 8.8%): made; an H100 (80 GB, 15.5%): not.
    EXPECT_TRUE(moe_decode_packed_choice(-1, 12.4e9, 40e9, 140e9, 141e9));
    EXPECT_FALSE(moe_decode_packed_choice(-1, 12.4e9, 40e9, 79e9, 80e9));
    // 120b on an H200: a 62.5 GB copy fits beside the model, but is not made unasked.
    EXPECT_FALSE(moe_decode_packed_choice(-1, 62.5e9, 135e9, 139e9, 141e9));
    // Exactly an eighth is still small.
    EXPECT_TRUE(moe_decode_packed_choice(-1, 10 * kGiB, 20 * kGiB, 80 * kGiB, 80 * kGiB));
}

TEST(MoeDecodePackedChoice, AskedWhereItFitsRefusedNever) {
    EXPECT_TRUE(moe_decode_packed_choice(1, 62.5e9, 135e9, 139e9, 141e9));
    EXPECT_FALSE(moe_decode_packed_choice(1, 62.5e9, 140e9, 139e9, 141e9));  // does not fit
    EXPECT_FALSE(moe_decode_packed_choice(-1, 1e9, 90e9, 79e9, 80e9));       // small, but the load does not fit
    EXPECT_FALSE(moe_decode_packed_choice(0, 1e9, 10e9, 139e9, 141e9));
}

}  // namespace
}  // namespace gptoss::model
