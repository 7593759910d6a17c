// One step of a constrained request, as the o200k tests draw them: the constraint's mask (its time added to
// `*mask_ms`) and the ids it allows, in ascending order.
#pragma once

#include <chrono>
#include <cstdint>
#include <vector>

#include "runtime/token_constraint.h"

namespace gptoss::structured::testing {

struct MaskStep {
    bool constrained = false;      // allowed_next gave a mask
    std::vector<int32_t> allowed;  // the ids it allows
};

inline MaskStep mask_step(runtime::TokenConstraint& c, std::vector<uint8_t>* mask, double* mask_ms) {
    MaskStep s;
    const auto t0 = std::chrono::steady_clock::now();
    s.constrained = c.allowed_next(mask);
    *mask_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s.constrained)
        for (size_t id = 0; id < mask->size(); ++id)
            if ((*mask)[id]) s.allowed.push_back(static_cast<int32_t>(id));
    return s;
}

}  // namespace gptoss::structured::testing
