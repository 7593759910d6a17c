// Disaggregated prefill's pieces on their own: the KV transfer's wire format (round trip, every
// truncation and corruption refused without a crash) and the KV cache's import of a prefix computed
// elsewhere (found by match_prefix afterwards, cached blocks kept, nothing held when there is no room).
#include "runtime/kv_transfer.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <tuple>

#include "runtime/kv_cache.h"

namespace gptoss::runtime {
namespace {

KvFormat test_format(int block_size = 4, int window = 5) {
    KvFormat f;
    f.dtype = KvDtype::kBf16;
    f.num_hidden_layers = 3;
    f.num_key_value_heads = 1;
    f.head_dim = 8;
    f.hidden_size = 64;
    f.vocab_size = 300;
    f.sliding_window = window;
    f.block_size = block_size;
    f.layer_kinds = 0b101;
    f.bytes_per_block_full = 2 * 4 * 8 * 2;                  // one full layer: K and V of 4 slots of 8 bf16
    f.bytes_per_block_sliding = 2 * f.bytes_per_block_full;  // two sliding layers
    f.model_id = 0x0123456789abcdefull;
    return f;
}

KvTransfer random_transfer(int num_blocks, uint32_t seed) {
    std::mt19937 rng(seed);
    KvTransfer t;
    t.format = test_format();
    const int bs = t.format.block_size;
    for (int i = 0; i < num_blocks * bs; ++i) t.tokens.push_back(static_cast<int32_t>(rng() % 300));
    t.first_sliding_block = first_window_block(num_blocks * bs, t.format.sliding_window, bs);
    t.full.resize(static_cast<size_t>(num_blocks) * t.format.bytes_per_block_full);
    t.sliding.resize(static_cast<size_t>(num_blocks - t.first_sliding_block) * t.format.bytes_per_block_sliding);
    // Random finite bf16 values: each little-endian high byte's bit 6 clear keeps the exponent short of all ones.
    for (size_t i = 0; i < t.full.size(); ++i) t.full[i] = static_cast<uint8_t>(rng()) & (i % 2 ? 0xBF : 0xFF);
    for (size_t i = 0; i < t.sliding.size(); ++i) t.sliding[i] = static_cast<uint8_t>(rng()) & (i % 2 ? 0xBF : 0xFF);
    return t;
}

TEST(KvTransfer, RoundTripsAndPassesItsOwnCheck) {
    for (int blocks : {1, 2, 7}) {
        const KvTransfer t = random_transfer(blocks, 10 + blocks);
        ASSERT_TRUE(check_kv_transfer(t, t.format).ok()) << check_kv_transfer(t, t.format).to_string();
        const std::string wire = serialize_kv_transfer(t);
        EXPECT_EQ(wire.size(), 84 + t.tokens.size() * 4 + t.full.size() + t.sliding.size());
        auto back = parse_kv_transfer(wire);
        ASSERT_TRUE(back.ok()) << back.status().to_string();
        EXPECT_TRUE(back->format == t.format);
        EXPECT_EQ(back->tokens, t.tokens);
        EXPECT_EQ(back->first_sliding_block, t.first_sliding_block);
        EXPECT_EQ(back->full, t.full);
        EXPECT_EQ(back->sliding, t.sliding);
    }
}

TEST(KvTransfer, TruncationsAndCorruptionsAreRefusedWithoutACrash) {
    const KvTransfer t = random_transfer(3, 5);
    const std::string wire = serialize_kv_transfer(t);
    // Every truncation and one extra byte: the sizes no longer add up.
    for (size_t n = 0; n < wire.size(); ++n) EXPECT_FALSE(parse_kv_transfer(wire.substr(0, n)).ok()) << n;
    EXPECT_FALSE(parse_kv_transfer(wire + "x").ok());
    auto expect_refused = [](std::string w, const std::string& words) {
        auto r = parse_kv_transfer(w);
        ASSERT_FALSE(r.ok());
        EXPECT_NE(r.status().message().find(words), std::string::npos) << r.status().message();
    };
    std::string bad = wire;
    bad[0] = 'X';
    expect_refused(bad, "GPTOSSKV");
    bad = wire;
    bad[8] = 1;  // version 1 (before model_id)
    expect_refused(bad, "version 1");
    bad = wire;
    bad[12] = 9;  // dtype
    expect_refused(bad, "dtype");
    bad = wire;
    bad[44] = 4;  // num_blocks 3 -> 4
    expect_refused(bad, "header describes");
    bad = wire;
    bad[47] = static_cast<char>(0x80);  // num_blocks past int32
    expect_refused(bad, "out of range");
    bad = wire;
    bad[48] = 9;  // first sliding block past the blocks
    expect_refused(bad, "first sliding block");
    bad = wire;
    for (int i = 0; i < 8; ++i) bad[60 + i] = static_cast<char>(0xff);  // bytes_per_block_full: 3 × it overflows
    expect_refused(bad, "overflow");
    // Random byte flips: parsed or refused, never a crash; what parses and passes the check has consistent sizes.
    std::mt19937 rng(3);
    int parsed = 0;
    for (int i = 0; i < 3000; ++i) {
        std::string w = wire;
        for (int k = 0; k < 1 + static_cast<int>(rng() % 3); ++k) w[rng() % 84] = static_cast<char>(rng());
        auto r = parse_kv_transfer(w);
        if (!r.ok() || !check_kv_transfer(*r, r->format).ok()) continue;
        ++parsed;
        EXPECT_EQ(r->full.size(), r->num_blocks() * r->format.bytes_per_block_full);
    }
    EXPECT_GT(parsed, 0);  // flips of the vocabulary, hidden size and other free fields still parse
}

// The reader a client streams an answer into: any split of the message gives parse_kv_transfer's transfer; a header
// describing more than the reader allows is refused before its buffers are allocated; errors stick.
TEST(KvTransfer, ReaderTakesTheMessageInAnyPieces) {
    const KvTransfer t = random_transfer(5, 21);
    const std::string wire = serialize_kv_transfer(t);
    EXPECT_EQ(wire.size(), kv_transfer_size(t));
    EXPECT_EQ(wire.substr(0, serialize_kv_transfer_head(t).size()), serialize_kv_transfer_head(t));
    std::mt19937 rng(5);
    for (int rep = 0; rep < 50; ++rep) {
        KvTransferReader reader(wire.size() + static_cast<size_t>(rep));  // room to spare is fine
        for (size_t at = 0; at < wire.size();) {
            const size_t n = std::min<size_t>(wire.size() - at, rep == 0 ? 1 : 1 + rng() % 200);
            ASSERT_TRUE(reader.feed(wire.data() + at, n).ok()) << at;
            at += n;
        }
        auto back = reader.finish();
        ASSERT_TRUE(back.ok()) << back.status().to_string();
        EXPECT_EQ(back->tokens, t.tokens);
        EXPECT_EQ(back->full, t.full);
        EXPECT_EQ(back->sliding, t.sliding);
        EXPECT_EQ(back->first_sliding_block, t.first_sliding_block);
        EXPECT_FALSE(reader.finish().ok());  // once
    }
    // One byte less room than the message: refused at the header, before the payloads arrive.
    KvTransferReader tight(wire.size() - 1);
    const Status st = tight.feed(wire.data(), 84);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("header describes"), std::string::npos) << st.message();
    EXPECT_FALSE(tight.feed(wire.data() + 84, 10).ok());  // the error sticks
    // A header asking for ~2^60 bytes (no overflow) is refused without allocating them.
    std::string huge = wire;
    for (int i = 0; i < 7; ++i) huge[60 + i] = 0;
    huge[67] = 0x10;  // bytes_per_block_full = 2^60
    KvTransferReader reader(1 << 20);
    EXPECT_FALSE(reader.feed(huge.data(), huge.size()).ok());
    // Past the described end, and short of it.
    KvTransferReader extra(wire.size() + 10);
    ASSERT_TRUE(extra.feed(wire.data(), wire.size()).ok());
    EXPECT_FALSE(extra.feed("x", 1).ok());
    KvTransferReader short_one(wire.size());
    ASSERT_TRUE(short_one.feed(wire.data(), wire.size() - 3).ok());
    EXPECT_FALSE(short_one.finish().ok());
    EXPECT_FALSE(KvTransferReader(wire.size()).finish().ok());  // nothing fed
}

TEST(KvTransfer, CheckRefusesAnotherFormatOrAShortWindow) {
    const KvTransfer t = random_transfer(4, 8);
    KvFormat other = t.format;
    other.block_size = 8;
    Status st = check_kv_transfer(t, other);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("block 4"), std::string::npos) << st.message();
    other = t.format;
    other.dtype = KvDtype::kE4m3;
    EXPECT_FALSE(check_kv_transfer(t, other).ok());
    // Another checkpoint of the same shapes (model_id, model::model_fingerprint): refused, naming both.
    other = t.format;
    other.model_id ^= 1;
    st = check_kv_transfer(t, other);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("model 0123456789abcdef"), std::string::npos) << st.message();
    EXPECT_NE(st.message().find("model 0123456789abcdee"), std::string::npos) << st.message();
    KvTransfer late = t;  // sliding blocks from one later than the window of position 16 needs
    late.first_sliding_block += 1;
    late.sliding.resize(late.sliding.size() - late.format.bytes_per_block_sliding);
    st = check_kv_transfer(late, t.format);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("window"), std::string::npos) << st.message();
    KvTransfer short_payload = t;
    short_payload.full.pop_back();
    EXPECT_FALSE(check_kv_transfer(short_payload, t.format).ok());
    KvTransfer bad_id = t;
    bad_id.tokens[2] = 300;
    EXPECT_FALSE(check_kv_transfer(bad_id, t.format).ok());
    // A NaN or an infinity anywhere in either payload (bf16 0x7FC0, 0xFF80), or e4m3's NaN, is refused.
    for (auto [sliding, at, hi, lo] :
         {std::tuple{false, size_t{6}, 0x7F, 0xC0}, std::tuple{true, size_t{40}, 0xFF, 0x80}}) {
        KvTransfer bad = t;
        KvBytes& b = sliding ? bad.sliding : bad.full;
        b[at] = static_cast<uint8_t>(lo);
        b[at + 1] = static_cast<uint8_t>(hi);
        st = check_kv_transfer(bad, t.format);
        ASSERT_FALSE(st.ok());
        EXPECT_NE(st.message().find("not finite"), std::string::npos) << st.message();
    }
    KvTransfer fp8 = t;
    fp8.format.dtype = KvDtype::kE4m3;
    for (auto& x : fp8.full) x &= 0x7E;  // finite e4m3 values
    for (auto& x : fp8.sliding) x &= 0x7E;
    EXPECT_TRUE(check_kv_transfer(fp8, fp8.format).ok());
    fp8.full[3] = 0xFF;
    EXPECT_FALSE(check_kv_transfer(fp8, fp8.format).ok());
}

Sequence make_sequence(uint64_t id, std::vector<int32_t> tokens) {
    Sequence s;
    s.id = id;
    s.num_prompt_tokens = static_cast<int>(tokens.size());
    s.tokens = std::move(tokens);
    return s;
}

std::vector<int32_t> ids(int n, int32_t base) {
    std::vector<int32_t> v;
    for (int i = 0; i < n; ++i) v.push_back(base + i);
    return v;
}

TEST(KvCacheImport, AnImportedPrefixIsFoundByMatchPrefix) {
    KvCacheManager kv(4, 5, {16, 8}, true);
    const std::vector<int32_t> prompt = ids(23, 10);
    const std::span<const int32_t> prefix = std::span(prompt).first(20);  // 5 blocks
    KvCacheManager::PrefixImport im;
    ASSERT_TRUE(kv.begin_import(prefix, &im));
    EXPECT_EQ(im.first_sliding, 4);  // the window of position 20: 16..20
    EXPECT_EQ(im.full.size(), 5u);
    EXPECT_EQ(im.sliding.size(), 1u);
    EXPECT_EQ(im.write_full, im.full);  // nothing was cached: every block to write
    EXPECT_EQ(kv.full().num_in_use(), 5);
    kv.finish_import(prefix, im, true);
    EXPECT_EQ(kv.full().num_in_use(), 0);
    EXPECT_EQ(kv.full().num_indexed(), 5);
    Sequence s = make_sequence(1, prompt);
    EXPECT_EQ(kv.match_prefix(s), 20);
    kv.admit(s, 20);
    EXPECT_EQ(std::vector<int32_t>(s.block_table_full.begin(), s.block_table_full.end()), im.full);
    EXPECT_EQ(s.block_table_sliding[4], im.sliding[0]);
    kv.free(s);
    // Another prompt sharing the first three blocks: they are kept (nothing to write), two are new.
    std::vector<int32_t> other = prompt;
    other[13] = 299;
    KvCacheManager::PrefixImport im2;
    ASSERT_TRUE(kv.begin_import(std::span(other).first(20), &im2));
    for (int b = 0; b < 3; ++b) {
        EXPECT_EQ(im2.full[b], im.full[b]);
        EXPECT_EQ(im2.write_full[b], -1);
    }
    EXPECT_GE(im2.write_full[3], 0);
    EXPECT_GE(im2.write_full[4], 0);
    kv.finish_import(std::span(other).first(20), im2, true);
    Sequence s2 = make_sequence(2, other);
    EXPECT_EQ(kv.match_prefix(s2), 20);
}

// Data-parallel groups: a block's KV is only in the group of the sequence that computed it (block_table_full[0] % dp).
// Two sequences computing one prompt at once in different groups leave the index with block 0 of one and blocks 1-2 of
// the other; a third sequence must not take those (it read the other group's absent KV: wrong logits under
// --layout dp=2 with the prefix cache). With one group every block is usable.
TEST(KvCacheDp, AMatchKeepsToTheGroupOfItsFirstBlock) {
    for (const bool sliding : {false, true}) {
        for (const int dp : {1, 2}) {
            KvCacheManager kv(4, sliding ? 8 : 0, {64, 64}, true);
            kv.set_dp_groups(dp);
            const std::vector<int32_t> prompt = ids(13, 10);  // 3 whole blocks and a token
            Sequence a = make_sequence(1, prompt);
            ASSERT_EQ(kv.match_prefix(a), 0);
            kv.admit(a, 0);
            kv.allocate(a, 13);
            // A second sequence of the same prompt whose first block is of the other parity (the other group): a
            // one-block sequence in between shifts the allocator's next id.
            Sequence pad = make_sequence(2, ids(1, 500));
            kv.admit(pad, 0);
            kv.allocate(pad, 1);
            Sequence c = make_sequence(3, prompt);
            kv.admit(c, 0);  // (computed concurrently with a: nothing cached yet)
            kv.allocate(c, 13);
            ASSERT_NE(c.block_table_full[0] % 2, a.block_table_full[0] % 2);
            c.num_computed = 4;  // c's block 0 is indexed first
            kv.on_computed(c);
            a.num_computed = 12;  // then a's blocks 1 and 2 (its block 0 is a duplicate: not indexed)
            kv.on_computed(a);
            Sequence b = make_sequence(99, prompt);
            EXPECT_EQ(kv.match_prefix(b), dp == 1 ? 12 : 4) << "dp " << dp << (sliding ? " sliding" : "");
            EXPECT_EQ(kv.cached_prefix_tokens(prompt), dp == 1 ? 12 : 4);
        }
    }
}

// The probe the decode worker asks before a fetch: what match_prefix would find, with nothing taken.
TEST(KvCacheImport, CachedPrefixTokensIsMatchPrefixWithoutTakingAnything) {
    KvCacheManager kv(4, 5, {16, 8}, true);
    const std::vector<int32_t> prompt = ids(23, 10);
    EXPECT_EQ(kv.cached_prefix_tokens(prompt), 0);
    KvCacheManager::PrefixImport im;
    ASSERT_TRUE(kv.begin_import(std::span(prompt).first(20), &im));
    kv.finish_import(std::span(prompt).first(20), im, true);
    EXPECT_EQ(kv.cached_prefix_tokens(prompt), 20);
    EXPECT_EQ(kv.cached_prefix_tokens(std::span(prompt).first(21)), 20);
    // One token is always computed, so 16 would be the most; but the window at 16 needs sliding block 3, which the
    // import (of the window at 20) did not bring.
    EXPECT_EQ(kv.cached_prefix_tokens(std::span(prompt).first(20)), 0);
    EXPECT_EQ(kv.cached_prefix_tokens(std::span(prompt).first(1)), 0);
    EXPECT_EQ(kv.cached_prefix_tokens({}), 0);
    std::vector<int32_t> other = prompt;
    other[13] = 299;  // block 3 differs: blocks 0-2 match, but block 2's window needs sliding blocks never imported
    EXPECT_EQ(kv.cached_prefix_tokens(other), 0);
    EXPECT_EQ(kv.full().num_in_use(), 0);  // nothing taken
    Sequence s = make_sequence(1, prompt);
    EXPECT_EQ(kv.match_prefix(s), kv.cached_prefix_tokens(prompt));
    KvCacheManager off(4, 5, {16, 8}, false);
    EXPECT_EQ(off.cached_prefix_tokens(prompt), 0);
}

TEST(KvCacheImport, HeldImportsLastUntilAdmissionOrPressure) {
    KvCacheManager kv(4, 5, {16, 8}, true);
    const std::vector<int32_t> prompt = ids(21, 40);
    const auto prefix = std::span(prompt).first(20);
    KvCacheManager::PrefixImport im;
    ASSERT_TRUE(kv.begin_import(prefix, &im));
    kv.index_import(prefix, im);
    kv.hold_import(7, im);
    EXPECT_EQ(kv.num_held_imports(), 1);
    EXPECT_EQ(kv.full().num_in_use(), 5);  // held: not evictable
    // Admission of sequence 7 takes its own references and lets the import's go.
    Sequence s = make_sequence(7, prompt);
    ASSERT_EQ(kv.match_prefix(s), 20);
    kv.admit(s, 20);
    EXPECT_EQ(kv.num_held_imports(), 0);
    EXPECT_EQ(kv.full().num_in_use(), 5);
    kv.free(s);
    EXPECT_EQ(kv.full().num_in_use(), 0);
    EXPECT_EQ(kv.full().num_indexed(), 5);
    // A held import dropped (its request ended), and one released under pressure: both leave cached blocks.
    std::vector<int32_t> other = prompt;
    other[0] = 299;
    ASSERT_TRUE(kv.begin_import(std::span(other).first(20), &im));
    kv.index_import(std::span(other).first(20), im);
    kv.hold_import(8, im);
    kv.drop_import(8);
    kv.drop_import(8);  // twice: nothing more
    EXPECT_EQ(kv.full().num_in_use(), 0);
    other[0] = 298;
    ASSERT_TRUE(kv.begin_import(std::span(other).first(20), &im));
    kv.index_import(std::span(other).first(20), im);
    kv.hold_import(9, im);
    EXPECT_TRUE(kv.release_held_imports());
    EXPECT_FALSE(kv.release_held_imports());
    EXPECT_EQ(kv.full().num_in_use(), 0);
    Sequence s9 = make_sequence(9, other);
    EXPECT_EQ(kv.match_prefix(s9), 20);
}

TEST(KvCacheImport, NoRoomOrAFailedWriteLeavesNothingBehind) {
    KvCacheManager kv(4, 5, {4, 8}, true);
    const std::vector<int32_t> prompt = ids(21, 3);
    KvCacheManager::PrefixImport im;
    EXPECT_FALSE(kv.begin_import(std::span(prompt).first(20), &im));  // 5 full blocks, 4 in the pool
    EXPECT_EQ(kv.full().num_free(), 4);
    EXPECT_EQ(kv.sliding().num_free(), 8);
    ASSERT_TRUE(kv.begin_import(std::span(prompt).first(16), &im));
    kv.finish_import(std::span(prompt).first(16), im, false);  // the copy failed: nothing indexed
    EXPECT_EQ(kv.full().num_indexed(), 0);
    EXPECT_EQ(kv.full().num_free(), 4);
    EXPECT_EQ(kv.sliding().num_free(), 8);
    Sequence s = make_sequence(1, prompt);
    EXPECT_EQ(kv.match_prefix(s), 0);
    KvCacheManager off(4, 5, {16, 8}, false);  // without prefix caching there is nowhere to put it
    EXPECT_FALSE(off.begin_import(std::span(prompt).first(16), &im));
}

}  // namespace
}  // namespace gptoss::runtime
