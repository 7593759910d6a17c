// Causal GQA attention with per-head sinks over a paged bf16 KV cache (MODEL.md §4.4), CUDA
// backend. Host launchers only; the argument struct is kernels/args/paged_attention_args.h.
//
// Requirements checked by every launcher (programmer errors, fatal): head_dim 64, num_heads =
// 8 · num_kv_heads (one CTA serves the 8 query heads of a kv head), block_size a power of two (any:
// the KV tiles of 64 keys are gathered key by key through the block table, so block_size and the
// tile need not divide each other), q/out/k_cache/v_cache/workspace 16-byte aligned, sinks non-null.
// Lengths and positions are read on the device; the host fields num_tokens / max_query_len /
// max_context_len only size grids, so every launch is capturable in a CUDA graph (no allocation,
// no synchronisation, no host reads of device memory).
#pragma once

#include <cuda_runtime.h>

#include "kernels/args/paged_attention_args.h"

namespace gptoss::kernels::cuda {

// Chunked prefill / mixed batches: sequence s has query_start[s+1] − query_start[s] ≥ 0 new
// tokens at positions seq_start_pos[s], …; max_query_len must bound every sequence's new tokens.
// FlashAttention-2 style on tensor cores (mma.sync m16n8k16 bf16, fp32 online softmax).
void paged_attention_prefill(const PagedAttentionArgs& args, cudaStream_t stream);

// Decode: exactly one new token per sequence (query_start[s] = s; a sequence with zero new tokens
// is skipped, which lets graph buckets pad the batch), at position seq_start_pos[s], context
// seq_start_pos[s] + 1. Split-KV flash-decoding: the number of splits comes from
// paged_attention_decode_split_count; the workspace must hold
// num_seqs · num_heads · max_splits · (head_dim + 2) floats whenever max_splits > 1.
void paged_attention_decode(const PagedAttentionArgs& args, cudaStream_t stream);

// The split count paged_attention_decode launches with: choose_decode_splits(…, args.max_splits, …),
// capped for one or two sequences at the thread-block cluster that merges the splits inside the
// kernel (16 on the H200, else 8).
int paged_attention_decode_split_count(const PagedAttentionArgs& args);

// Same as paged_attention_decode with an explicit split count (1 ≤ num_splits ≤ args.max_splits),
// for tests and benchmarks. The device spreads each sequence's KV range over at most num_splits
// CTAs (fewer when the context is short); num_splits is only the grid's upper bound.
void paged_attention_decode_splits(const PagedAttentionArgs& args, int num_splits, cudaStream_t stream);

// The split heuristic (host only, no CUDA calls): one wave of CTAs (num_seqs · num_kv_heads ·
// splits ≤ 3 per SM, the decode kernel's occupancy), at least one split, never more splits than
// the longest visible range can use (2 KV tiles of 64 keys each at least) nor more than max_splits.
int choose_decode_splits(int num_seqs, int num_kv_heads, int max_context_len, int sliding_window, int max_splits,
                         int sm_count);

// A simple, obviously correct kernel (one warp per (token, query head), two fp32 passes over the
// keys, expf as the CPU reference): a second oracle for tests and a portable fallback (STYLE.md
// rule 3). Accepts any batch the prefill launcher accepts, decode included. Slow.
void paged_attention_reference_cuda(const PagedAttentionArgs& args, cudaStream_t stream);

}  // namespace gptoss::kernels::cuda
