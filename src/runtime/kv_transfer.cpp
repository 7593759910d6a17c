#include "runtime/kv_transfer.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

namespace gptoss::runtime {
namespace {

constexpr char kMagic[8] = {'G', 'P', 'T', 'O', 'S', 'S', 'K', 'V'};
constexpr uint32_t kVersion = 2;  // 2: model_id (session 65)
constexpr size_t kHeaderBytes = sizeof(kMagic) + 11 * sizeof(uint32_t) + 4 * sizeof(uint64_t);  // 84

template <typename T>
void put(std::string* out, T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    out->append(b, sizeof(T));
}

class Reader {
public:
    explicit Reader(std::string_view s) : s_(s) {}
    template <typename T>
    T get() {
        T v{};
        std::memcpy(&v, s_.data() + pos_, sizeof(T));  // callers checked the header's length first
        pos_ += sizeof(T);
        return v;
    }
    size_t pos() const { return pos_; }

private:
    std::string_view s_;
    size_t pos_ = 0;
};

// a · b, or false when it overflows size_t.
bool mul(size_t a, size_t b, size_t* out) {
    if (b != 0 && a > std::numeric_limits<size_t>::max() / b) return false;
    *out = a * b;
    return true;
}

}  // namespace

const char* kv_dtype_name(KvDtype d) {
    switch (d) {
        case KvDtype::kF32: return "f32";
        case KvDtype::kF32E4m3: return "f32 (e4m3 values)";
        case KvDtype::kBf16: return "bf16";
        case KvDtype::kE4m3: return "e4m3";
    }
    return "unknown";
}

std::string KvFormat::describe() const {
    char hex[17];
    std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(model_id));
    return std::string(kv_dtype_name(dtype)) + ", block " + std::to_string(block_size) + ", " +
           std::to_string(num_hidden_layers) + " layers × " + std::to_string(num_key_value_heads) + " kv heads × " +
           std::to_string(head_dim) + ", hidden " + std::to_string(hidden_size) + ", vocab " +
           std::to_string(vocab_size) + ", window " + std::to_string(sliding_window) + ", model " + hex;
}

KvFormat make_kv_format(const model::GptOssConfig& c, KvDtype dtype, int num_key_value_heads, int block_size,
                        size_t bytes_per_block_full, size_t bytes_per_block_sliding, uint64_t model_id) {
    KvFormat f;
    f.model_id = model_id;
    f.dtype = dtype;
    f.num_hidden_layers = c.num_hidden_layers;
    f.num_key_value_heads = num_key_value_heads;
    f.head_dim = c.head_dim;
    f.hidden_size = c.hidden_size;
    f.vocab_size = c.vocab_size;
    f.block_size = block_size;
    for (int l = 0; l < c.num_hidden_layers && l < 64; ++l)
        if (c.is_sliding(l)) f.layer_kinds |= uint64_t{1} << l;
    f.sliding_window = f.layer_kinds != 0 ? c.sliding_window : 0;
    f.bytes_per_block_full = bytes_per_block_full;
    f.bytes_per_block_sliding = bytes_per_block_sliding;
    return f;
}

std::string serialize_kv_transfer_head(const KvTransfer& t) {
    const KvFormat& f = t.format;
    std::string out;
    out.reserve(kHeaderBytes + t.tokens.size() * 4);
    out.append(kMagic, sizeof(kMagic));
    put<uint32_t>(&out, kVersion);
    put<uint32_t>(&out, static_cast<uint32_t>(f.dtype));
    for (int v : {f.num_hidden_layers, f.num_key_value_heads, f.head_dim, f.hidden_size, f.vocab_size, f.sliding_window,
                  f.block_size, t.num_blocks(), t.first_sliding_block})
        put<uint32_t>(&out, static_cast<uint32_t>(v));
    put<uint64_t>(&out, f.layer_kinds);
    put<uint64_t>(&out, f.bytes_per_block_full);
    put<uint64_t>(&out, f.bytes_per_block_sliding);
    put<uint64_t>(&out, f.model_id);
    for (int32_t id : t.tokens) put<int32_t>(&out, id);
    return out;
}

size_t kv_transfer_size(const KvTransfer& t) {
    return kHeaderBytes + t.tokens.size() * sizeof(int32_t) + t.full.size() + t.sliding.size();
}

std::string serialize_kv_transfer(const KvTransfer& t) {
    std::string out = serialize_kv_transfer_head(t);
    out.reserve(kv_transfer_size(t));
    out.append(reinterpret_cast<const char*>(t.full.data()), t.full.size());
    out.append(reinterpret_cast<const char*>(t.sliding.data()), t.sliding.size());
    return out;
}

StatusOr<KvTransfer> parse_kv_transfer(std::string_view bytes) {
    KvTransferReader reader(bytes.size());
    RETURN_IF_ERROR(reader.feed(bytes.data(), bytes.size()));
    return reader.finish();
}

Status KvTransferReader::parse_head() {
    const std::string_view bytes = head_;
    if (std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
        return invalid_argument("not a KV transfer (no GPTOSSKV header)");
    Reader r(bytes.substr(sizeof(kMagic)));
    const uint32_t version = r.get<uint32_t>();
    if (version != kVersion)
        return invalid_argument("KV transfer version " + std::to_string(version) + " (this build reads version " +
                                std::to_string(kVersion) + ")");
    const uint32_t dtype = r.get<uint32_t>();
    if (dtype < static_cast<uint32_t>(KvDtype::kF32) || dtype > static_cast<uint32_t>(KvDtype::kE4m3))
        return invalid_argument("KV transfer: unknown dtype " + std::to_string(dtype));
    uint32_t v[9];
    for (uint32_t& x : v) x = r.get<uint32_t>();
    for (uint32_t x : v)
        if (x > static_cast<uint32_t>(std::numeric_limits<int32_t>::max()))
            return invalid_argument("KV transfer: a header field is out of range");
    KvFormat& f = t_.format;
    f.dtype = static_cast<KvDtype>(dtype);
    f.num_hidden_layers = static_cast<int>(v[0]);
    f.num_key_value_heads = static_cast<int>(v[1]);
    f.head_dim = static_cast<int>(v[2]);
    f.hidden_size = static_cast<int>(v[3]);
    f.vocab_size = static_cast<int>(v[4]);
    f.sliding_window = static_cast<int>(v[5]);
    f.block_size = static_cast<int>(v[6]);
    const int num_blocks = static_cast<int>(v[7]);
    t_.first_sliding_block = static_cast<int>(v[8]);
    f.layer_kinds = r.get<uint64_t>();
    f.bytes_per_block_full = r.get<uint64_t>();
    f.bytes_per_block_sliding = r.get<uint64_t>();
    f.model_id = r.get<uint64_t>();
    if (f.block_size <= 0) return invalid_argument("KV transfer: block size 0");
    if (t_.first_sliding_block > num_blocks)
        return invalid_argument("KV transfer: first sliding block past the blocks");
    size_t n_tokens = 0;
    if (!mul(static_cast<size_t>(num_blocks), static_cast<size_t>(f.block_size), &n_tokens) ||
        !mul(n_tokens, sizeof(int32_t), &token_bytes_) ||
        !mul(static_cast<size_t>(num_blocks), f.bytes_per_block_full, &full_bytes_) ||
        !mul(static_cast<size_t>(num_blocks - t_.first_sliding_block), f.bytes_per_block_sliding, &sliding_bytes_))
        return invalid_argument("KV transfer: sizes overflow");
    const size_t room = max_bytes_ - kHeaderBytes;  // max_bytes_ ≥ kHeaderBytes: the header arrived within it
    if (token_bytes_ > room || full_bytes_ > room - token_bytes_ || sliding_bytes_ > room - token_bytes_ - full_bytes_)
        return invalid_argument("KV transfer: at most " + std::to_string(max_bytes_) + " bytes, the header describes " +
                                std::to_string(kHeaderBytes) + " + " + std::to_string(token_bytes_) + " + " +
                                std::to_string(full_bytes_) + " + " + std::to_string(sliding_bytes_));
    t_.tokens.resize(n_tokens);
    t_.full.resize(full_bytes_);
    t_.sliding.resize(sliding_bytes_);
    return ok_status();
}

Status KvTransferReader::feed(const char* data, size_t n) {
    if (!error_.ok()) return error_;
    if (!have_head_) {
        if (max_bytes_ < kHeaderBytes) {
            error_ = invalid_argument("KV transfer: at most " + std::to_string(max_bytes_) +
                                      " bytes, fewer than its header's " + std::to_string(kHeaderBytes));
            return error_;
        }
        const size_t take = std::min(n, kHeaderBytes - head_.size());
        head_.append(data, take);
        data += take;
        n -= take;
        if (head_.size() < kHeaderBytes) return ok_status();
        have_head_ = true;
        error_ = parse_head();
        if (!error_.ok()) return error_;
    }
    if (n > token_bytes_ + full_bytes_ + sliding_bytes_ - body_received_) {
        error_ = invalid_argument("KV transfer: more bytes than the header describes (" + std::to_string(kHeaderBytes) +
                                  " + " + std::to_string(token_bytes_) + " + " + std::to_string(full_bytes_) + " + " +
                                  std::to_string(sliding_bytes_) + ")");
        return error_;
    }
    // Each region in turn: [0, token_bytes) the ids, then full, then sliding.
    struct Region {
        uint8_t* p;
        size_t size;
    };
    const Region regions[3] = {{reinterpret_cast<uint8_t*>(t_.tokens.data()), token_bytes_},
                               {t_.full.data(), full_bytes_},
                               {t_.sliding.data(), sliding_bytes_}};
    size_t start = 0;
    for (const Region& r : regions) {
        if (n == 0) break;
        if (body_received_ < start + r.size) {
            const size_t at = body_received_ - start, k = std::min(n, r.size - at);
            std::memcpy(r.p + at, data, k);
            data += k;
            n -= k;
            body_received_ += k;
        }
        start += r.size;
    }
    return ok_status();
}

StatusOr<KvTransfer> KvTransferReader::finish() {
    if (!error_.ok()) return error_;
    if (!have_head_) return invalid_argument("not a KV transfer (no GPTOSSKV header)");
    if (body_received_ != token_bytes_ + full_bytes_ + sliding_bytes_)
        return invalid_argument("KV transfer: " + std::to_string(kHeaderBytes + body_received_) +
                                " bytes, the header describes " + std::to_string(kHeaderBytes) + " + " +
                                std::to_string(token_bytes_) + " + " + std::to_string(full_bytes_) + " + " +
                                std::to_string(sliding_bytes_));
    error_ = failed_precondition("KvTransferReader: finish() was called already");
    return std::move(t_);
}

namespace {

// Whether every value of a payload in the cache's dtype is finite (an exponent field short of all ones; e4m3fn has
// no infinity, its NaN is S.1111.111).
bool kv_values_finite(KvDtype dtype, const KvBytes& bytes) {
    const size_t n = bytes.size();
    const uint8_t* p = bytes.data();
    switch (dtype) {
        case KvDtype::kF32:
        case KvDtype::kF32E4m3: {
            uint32_t bad = 0;  // (no early exit: a branch-free pass over hundreds of MB vectorizes)
            for (size_t i = 0; i + 4 <= n; i += 4) {
                uint32_t v;
                std::memcpy(&v, p + i, 4);
                bad |= static_cast<uint32_t>((v & 0x7F800000u) == 0x7F800000u);
            }
            return bad == 0;
        }
        case KvDtype::kBf16: {
            uint32_t bad = 0;
            for (size_t i = 0; i + 2 <= n; i += 2) {
                uint16_t v;
                std::memcpy(&v, p + i, 2);
                bad |= static_cast<uint32_t>((v & 0x7F80u) == 0x7F80u);
            }
            return bad == 0;
        }
        case KvDtype::kE4m3: {
            uint32_t bad = 0;
            for (size_t i = 0; i < n; ++i) bad |= static_cast<uint32_t>((p[i] & 0x7Fu) == 0x7Fu);
            return bad == 0;
        }
    }
    return false;
}

}  // namespace

Status check_kv_transfer(const KvTransfer& t, const KvFormat& expected) {
    if (!(t.format == expected))
        return invalid_argument("the KV transfer's format (" + t.format.describe() + ") is not this engine's (" +
                                expected.describe() + ")");
    const int bs = expected.block_size;
    if (bs <= 0 || t.tokens.size() % static_cast<size_t>(bs) != 0)
        return invalid_argument("the KV transfer's tokens are not whole blocks");
    const int k = t.num_blocks();
    if (k == 0) return invalid_argument("the KV transfer holds no block");
    if (t.first_sliding_block < 0 || t.first_sliding_block > k)
        return invalid_argument("the KV transfer's first sliding block is out of range");
    if (expected.sliding_window > 0 && t.first_sliding_block > first_window_block(k * bs, expected.sliding_window, bs))
        return invalid_argument("the KV transfer lacks sliding-window blocks its last window needs");
    if (t.full.size() != static_cast<size_t>(k) * expected.bytes_per_block_full ||
        t.sliding.size() != static_cast<size_t>(k - t.first_sliding_block) * expected.bytes_per_block_sliding)
        return invalid_argument("the KV transfer's payload does not match its block count");
    for (int32_t id : t.tokens)
        if (id < 0 || id >= expected.vocab_size)
            return invalid_argument("the KV transfer holds an id outside the vocabulary");
    // A NaN or infinity in the cache would give every request that reuses these blocks from the prefix cache
    // non-finite logits (a probe's one NaN transfer made every later chat request fail): refused, so that the
    // prompt is computed here instead.
    if (!kv_values_finite(expected.dtype, t.full) || !kv_values_finite(expected.dtype, t.sliding))
        return invalid_argument("the KV transfer holds a value that is not finite (NaN or infinity)");
    return ok_status();
}

}  // namespace gptoss::runtime
