// Small helpers shared by the CLI subcommands.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
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

// A message for the terminal: bytes that are not UTF-8, and control bytes other than tab and newline, as \xNN (file
// contents quoted in an error, e.g. a JSON parser's "last read", could carry any byte).
std::string terminal_safe(std::string_view message);

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

// An output file named on the command line (logits --out, bench --json / --markdown, bench-serve --markdown),
// resolved before any work so that a bad path fails at once, not after a long run. Symlinks are followed (the
// file a link names is written, the link stays). An existing FIFO or device (/dev/null, /dev/stdout) is written
// through: replacing it by rename would delete the device node when run as root. Anything else is written to a
// temporary file beside the target and renamed into place, so a failed write leaves the old file whole.
struct OutputTarget {
    std::filesystem::path path;
    bool write_through = false;
};
// Refused: an empty path, a directory, a missing or non-directory parent, a target or directory not writable.
StatusOr<OutputTarget> resolve_output_target(const std::string& out);
// Writes `bytes` to the target.
Status write_output(const OutputTarget& target, std::string_view bytes);
// Moves (or copies, when written through) a finished file to the target; `finished` must be in
// temporary_dir_for(target) so that the rename stays on one filesystem.
Status place_output_file(const OutputTarget& target, const std::filesystem::path& finished);
// Where to make a temporary file or directory for the target: its directory, or the system's temporary
// directory for a target written through (/dev is not writable).
std::filesystem::path temporary_dir_for(const OutputTarget& target);

}  // namespace gptoss::cli
