#!/usr/bin/env python3
"""Encode the corpus of tools/tokenizer_corpus.py into a golden JSONL file.

    python3 tools/make_tokenizer_golden.py --tokenizer PATH/tokenizer.json --out tests/data/tokenizer_golden.jsonl

One JSON object per line:
    {"category": str, "text": str, "ids": [int, ...]}            always
    "ids_hf_specials": [...]   only for texts where HF's normal tokenizer turns special-token text
                               (e.g. "<|start|>") into special ids: what tokenizer.encode(text).ids gives
    "ids_tiktoken": [...]      only if tiktoken's encode_ordinary disagrees with "ids"
    "ids_pyref": [...]         only if tools/bpe_ref.py disagrees with "ids"

"ids" = encode_ordinary semantics: the HF tokenizer rebuilt from the same JSON with its
added_tokens removed (so text that looks like a special token is ordinary text), encoded with
add_special_tokens=False. Checks: on every text without special-looking matches the normal
tokenizer gives the same ids; no id is >= the BPE vocab size; decode(ids) == text; and the ids
are compared with tiktoken (an Encoding built offline from the same ranks and the o200k regex;
the ranks are verified against o200k_base's sha256) and with the pure-Python tools/bpe_ref.py.
Lines are written with ensure_ascii=False, except that U+2028, U+2029 and U+0085 are escaped
so that no line-splitting routine can break a line.

--ref-only: no `tokenizers` needed; "ids" come from tools/bpe_ref.py (testing this tool only).
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe_ref  # noqa: E402
import tokenizer_corpus  # noqa: E402


def dump_line(obj):
    s = json.dumps(obj, ensure_ascii=False)
    return s.replace("\u2028", "\\u2028").replace("\u2029", "\\u2029").replace("\u0085", "\\u0085")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", required=True, help="HF tokenizer.json of gpt-oss (o200k_harmony)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref-only", action="store_true", help="use tools/bpe_ref.py only (no tokenizers); testing")
    args = ap.parse_args()

    with open(args.tokenizer, encoding="utf-8") as f:
        tj = json.load(f)
    n_vocab = len(tj["model"]["vocab"])
    special_ids = {t["id"]: t["content"] for t in tj.get("added_tokens", [])}
    assert all(i >= n_vocab for i in special_ids), "an added token lies inside the BPE vocab"

    ref = bpe_ref.RefEncoder(args.tokenizer)
    sha_ok = ref.ranks_sha256() == bpe_ref.O200K_SHA256
    pat_ok = ref.pattern_json == bpe_ref.O200K_PATTERN
    print(f"tokenizer: {n_vocab} BPE tokens, {len(special_ids)} added tokens; ranks sha256 matches o200k_base: {sha_ok};"
          f" split regex equals MODEL.md's: {pat_ok}", flush=True)
    problems = []
    if not sha_ok:
        problems.append("mergeable ranks are not o200k_base")
    if not pat_ok:
        problems.append("pre-tokenizer regex differs from MODEL.md")

    hf = plain = None
    if not args.ref_only:
        from tokenizers import Tokenizer
        hf = Tokenizer.from_file(args.tokenizer)
        tj_plain = dict(tj)
        tj_plain["added_tokens"] = []
        plain = Tokenizer.from_str(json.dumps(tj_plain))
    tk = None
    try:
        import tiktoken
        tk = tiktoken.Encoding(name="o200k_base_from_tokenizer_json", pat_str=bpe_ref.O200K_PATTERN,
                               mergeable_ranks=dict(ref.ranks), special_tokens={})
    except Exception as e:  # optional cross-check
        print(f"tiktoken cross-check unavailable: {e!r}", flush=True)

    corpus = tokenizer_corpus.corpus()
    n_spec = n_tk_bad = n_ref_bad = n_tokens = 0
    lines = []
    for cat, text in corpus:
        text.encode("utf-8")  # no lone surrogates
        ids_ref = ref.encode_ordinary(text)
        if plain is not None:
            ids = plain.encode(text, add_special_tokens=False).ids
            ids_hf = hf.encode(text, add_special_tokens=False).ids
            dec = plain.decode(ids, skip_special_tokens=False)
        else:
            ids = ids_ref
            ids_hf = ids
            dec = ref.decode_bytes(ids).decode("utf-8")
        rec = {"category": cat, "text": text, "ids": ids}
        if any(i >= n_vocab for i in ids):
            problems.append(f"special/out-of-vocab id in ordinary encoding of {text[:40]!r}")
        if dec != text:
            problems.append(f"decode(ids) != text for {text[:40]!r}: {dec[:40]!r}")
        if ref.decode_bytes(ids) != text.encode("utf-8"):
            problems.append(f"byte-level decode of ids != UTF-8 of {text[:40]!r}")
        if ids_hf != ids:
            if any(i in special_ids for i in ids_hf):
                rec["ids_hf_specials"] = ids_hf
                n_spec += 1
            else:
                problems.append(f"HF tokenizer with and without added tokens differ on {text[:40]!r}")
        if tk is not None:
            ids_tk = tk.encode_ordinary(text)
            if ids_tk != ids:
                rec["ids_tiktoken"] = ids_tk
                n_tk_bad += 1
        if ids_ref != ids:
            rec["ids_pyref"] = ids_ref
            n_ref_bad += 1
        n_tokens += len(ids)
        lines.append(dump_line(rec))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8", newline="\n") as f:
        for ln in lines:
            f.write(ln + "\n")
    # read back: one JSON object per line, texts identical
    with open(args.out, encoding="utf-8", newline="\n") as f:
        back = [json.loads(ln) for ln in f.read().split("\n") if ln]
    assert [b["text"] for b in back] == [t for _, t in corpus], "read-back mismatch"

    src = "bpe_ref.py (--ref-only: NOT the HF golden)" if args.ref_only else "HF tokenizers (added tokens removed)"
    print(f"wrote {args.out}: {len(lines)} lines, {n_tokens} tokens, ids from {src}")
    print(f"  texts where HF's normal tokenizer matched special tokens: {n_spec} (field ids_hf_specials)")
    print(f"  tiktoken encode_ordinary disagreements: {n_tk_bad if tk is not None else 'not checked'} (field ids_tiktoken)")
    print(f"  tools/bpe_ref.py disagreements: {n_ref_bad} (field ids_pyref)")
    for ln in lines[:2] + [ln for ln in lines if "ids_hf_specials" in ln][:1]:
        print("  sample:", ln[:300])
    if n_tk_bad or n_ref_bad:
        print("WARNING: the encoders disagree on some lines; the engine follows tiktoken's algorithm, so look at"
              " the lines carrying ids_tiktoken / ids_pyref before trusting 'ids' there")
    if problems:
        for p in problems[:50]:
            print("FAILED:", p)
        print(f"RESULT: {len(problems)} problem(s)")
        sys.exit(1)
    print("RESULT: ok")


if __name__ == "__main__":
    main()
