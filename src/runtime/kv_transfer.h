// Disaggregated prefill: one engine (the prefill worker) computes a prompt's KV cache and exports
// it, another (the decode worker) imports it into its prefix cache and computes only the rest. What
// travels is whole KV blocks in the cache's own format, so both sides must run the same model with
// the same cache format and block size (KvFormat says which; a mismatch is refused, never converted).
//
// The wire format (version 2, little-endian), one self-contained message:
//   "GPTOSSKV" · u32 version · u32 dtype · u32 num_hidden_layers · u32 num_key_value_heads ·
//   u32 head_dim · u32 hidden_size · u32 vocab_size · u32 sliding_window · u32 block_size ·
//   u32 num_blocks · u32 first_sliding_block · u64 layer_kinds (bit l set: layer l is sliding) ·
//   u64 bytes_per_block_full · u64 bytes_per_block_sliding · u64 model_id (version 2) ·
//   i32 tokens[num_blocks · block_size] · u8 full[num_blocks · bytes_per_block_full] ·
//   u8 sliding[(num_blocks − first_sliding_block) · bytes_per_block_sliding]
// A block's bytes are the runner's: for each layer of its pool in layer order, K then V of the
// block's block_size slots (ModelRunner::read_kv_blocks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/large_buffer.h"
#include "core/status.h"
#include "model/gpt_oss_config.h"

namespace gptoss::runtime {

enum class KvDtype : uint32_t {
    kF32 = 1,      // the CPU backend's cache
    kF32E4m3 = 2,  // the CPU backend's FP8 cache (fp32 holding e4m3 values)
    kBf16 = 3,     // the CUDA backend's cache
    kE4m3 = 4,     // the CUDA backend's FP8 cache (--kv-cache-dtype fp8)
};
const char* kv_dtype_name(KvDtype d);

// What both sides of a transfer must agree on.
struct KvFormat {
    KvDtype dtype = KvDtype::kF32;
    int num_hidden_layers = 0;
    int num_key_value_heads = 0;  // the heads one block holds
    int head_dim = 0;
    int hidden_size = 0;
    int vocab_size = 0;
    int sliding_window = 0;              // 0: no sliding-window layers
    int block_size = 0;                  // tokens a block
    uint64_t layer_kinds = 0;            // bit l: layer l is a sliding-window layer
    size_t bytes_per_block_full = 0;     // K and V of one block over all full-attention layers
    size_t bytes_per_block_sliding = 0;  // the same over all sliding-window layers
    // model::model_fingerprint of the weights the KV came from: the same shapes of another checkpoint (another seed,
    // fine-tune or rope) give other values, which no shape check sees (0: none given).
    uint64_t model_id = 0;

    bool operator==(const KvFormat&) const = default;
    std::string describe() const;  // e.g. "bf16, block 16, 24 layers × 8 kv heads × 64, hidden 2880"
};

// A runner's format (ModelRunner::kv_format); the model may have at most 64 layers (layer_kinds).
KvFormat make_kv_format(const model::GptOssConfig& c, KvDtype dtype, int num_key_value_heads, int block_size,
                        size_t bytes_per_block_full, size_t bytes_per_block_sliding, uint64_t model_id);

// The KV of a prompt's first num_blocks() · block_size positions.
// Payload buffers: hundreds of MB written once right after allocation, so huge pages (core/large_buffer.h).
using KvBytes = std::vector<uint8_t, LargeBufferAllocator<uint8_t>>;

struct KvTransfer {
    KvFormat format;
    std::vector<int32_t> tokens;  // [num_blocks · block_size] the ids whose KV this is
    // Sliding-window layers: blocks [first_sliding_block, num_blocks) are included (the window of
    // the token at num_blocks · block_size); earlier ones are not needed.
    int first_sliding_block = 0;
    KvBytes full;     // [num_blocks, bytes_per_block_full]
    KvBytes sliding;  // [num_blocks − first_sliding_block, bytes_per_block_sliding]

    int num_blocks() const { return format.block_size > 0 ? static_cast<int>(tokens.size()) / format.block_size : 0; }
};

// The first sliding-window block a sequence resuming at position `pos` reads (its window's start).
inline int first_window_block(int pos, int sliding_window, int block_size) {
    const int start = pos - sliding_window + 1;
    return (start > 0 ? start : 0) / block_size;
}

// The message: serialize_kv_transfer_head(t) (the header and the ids), then t.full, then t.sliding. A server can
// send the three pieces as they are rather than joined (the payloads are most of it: ~200 MB for 8k tokens of 20b).
std::string serialize_kv_transfer(const KvTransfer& t);
std::string serialize_kv_transfer_head(const KvTransfer& t);
size_t kv_transfer_size(const KvTransfer& t);
// Checks every size against the message's own header (never trusts a length before checking it
// fits): invalid_argument with what is wrong for a short, long or inconsistent message.
StatusOr<KvTransfer> parse_kv_transfer(std::string_view bytes);

// parse_kv_transfer on a message that arrives in pieces: the payloads are written straight into the transfer's
// buffers (no copy of the whole message first). A header that describes more than `max_bytes` is refused before
// anything is allocated. feed() each piece in order (an error sticks), then finish().
class KvTransferReader {
public:
    explicit KvTransferReader(size_t max_bytes) : max_bytes_(max_bytes) {}
    Status feed(const char* data, size_t n);
    StatusOr<KvTransfer> finish();

private:
    Status parse_head();  // head_ holds the whole header: checks it, sizes t_

    size_t max_bytes_;
    Status error_;
    std::string head_;  // the header's bytes while it is incomplete
    bool have_head_ = false;
    KvTransfer t_;
    size_t token_bytes_ = 0, full_bytes_ = 0, sliding_bytes_ = 0;
    size_t body_received_ = 0;  // bytes after the header
};
// invalid_argument unless `t` is a well-formed transfer in `expected` format (its sizes, its
// first_sliding_block at most the window's first block).
Status check_kv_transfer(const KvTransfer& t, const KvFormat& expected);

}  // namespace gptoss::runtime
