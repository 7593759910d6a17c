// The real o200k_harmony tokenizer.json fetched by scripts/setup.sh, loaded once per test binary.
#pragma once

#include <gtest/gtest.h>

#include "tokenizer/bpe_tokenizer.h"

namespace gptoss::tokenizer::testing {

// nullptr when the fixture is missing (then the test skips).
inline const BpeTokenizer* fixture_tokenizer() {
    static const BpeTokenizer* tok = []() -> const BpeTokenizer* {
        auto path = find_tokenizer_file("");
        if (!path) return nullptr;
        auto loaded = BpeTokenizer::from_file(*path);
        if (!loaded.ok()) {
            ADD_FAILURE() << "fixture tokenizer does not load: " << loaded.status().to_string();
            return nullptr;
        }
        return loaded->release();  // lives for the whole test run
    }();
    return tok;
}

}  // namespace gptoss::tokenizer::testing

#define GPTOSS_REQUIRE_TOKENIZER_FIXTURE(var)                                                             \
    const ::gptoss::tokenizer::BpeTokenizer* var = ::gptoss::tokenizer::testing::fixture_tokenizer();     \
    if (!var)                                                                                             \
    GTEST_SKIP() << "tokenizer fixture .cache/tokenizer/tokenizer.json is missing: run scripts/setup.sh " \
                    "(or set GPTOSS_TOKENIZER)"
