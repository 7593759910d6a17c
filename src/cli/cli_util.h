// Small helpers shared by the CLI subcommands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "model/gpt_oss_config.h"

namespace gptoss::cli {

// "1,2, 3" -> {1, 2, 3}. Rejects empty items, non-digits and values outside int32.
StatusOr<std::vector<int32_t>> parse_id_list(const std::string& text, const char* what = "a token id");

// --kv-cache-dtype (vLLM's names): "auto" or "bf16" -> false, "fp8" or "fp8_e4m3" -> true (an e4m3
// KV cache, model::CudaModelOptions::kv_fp8); anything else is an error naming the choices.
StatusOr<bool> parse_kv_cache_dtype(const std::string& text);

// --seed / a batch line's seed: a decimal 64-bit integer, signed or unsigned; -1 asks for a random seed
// (nullopt), as in vLLM and llama.cpp (runtime::seed_from_signed).
StatusOr<std::optional<uint64_t>> parse_seed(std::string_view text);

// Shortest round-trip text of a float, as JSON wants it (nan/inf become null).
std::string json_float(float v);

// JSON from a file or stdin: refused past this nesting or object size, before parsing (server/openai_json.h
// json_shape_error; ~60,000 levels overflowed the stack in nlohmann's recursion).
inline constexpr int kCliJsonDepth = 512;
inline constexpr int kCliJsonMembers = 1 << 16;

// This machine's physical memory in MiB (0 when unknown): a bound for sizes the CPU backend allocates at once.
size_t physical_memory_mib();

// --synthetic PRESET: why its weights cannot be built in this machine's memory (they are built in host memory
// for either backend), or "" when they fit or the memory is unknown. Said before building, which would otherwise
// grow until the kernel kills the process.
std::string synthetic_memory_error(const model::GptOssConfig& config, const std::string& preset);

}  // namespace gptoss::cli
