"""A small, slow, independent o200k encoder (tiktoken's algorithm) built from an HF tokenizer.json.

Used as a cross-check of the HF `tokenizers` golden ids (make_tokenizer_golden.py) and runnable
where `tokenizers` is not installed. Needs the `regex` package (for \\p{..} classes).

  * mergeable ranks: the BPE vocab of tokenizer.json, each token string mapped back to bytes with
    GPT-2's byte<->unicode table; id = rank. ranks_sha256() rebuilds the o200k_base.tiktoken file
    text from them: its sha256 must be 446a9538...1a2d (MODEL.md section 5).
  * encode_ordinary(text): split with the pre-tokenizer regex; a piece that is a whole token is
    emitted as is; otherwise start from single bytes and repeatedly merge the adjacent pair whose
    concatenation has the lowest rank (leftmost on ties) -- tiktoken's byte_pair_merge.
    Special tokens are never produced.
"""
import base64
import hashlib
import json

O200K_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
# MODEL.md section 5 (= tiktoken's o200k_base pat_str)
O200K_PATTERN = "|".join([
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable unicode character map (used by ByteLevel)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class RefEncoder:
    def __init__(self, tokenizer_json_path):
        import regex
        with open(tokenizer_json_path, encoding="utf-8") as f:
            tj = json.load(f)
        u2b = {c: b for b, c in bytes_to_unicode().items()}
        vocab = tj["model"]["vocab"]
        self.ranks = {bytes(u2b[ch] for ch in tok): i for tok, i in vocab.items()}
        assert len(self.ranks) == len(vocab)
        self.decoder = {i: b for b, i in self.ranks.items()}
        self.specials = {t["content"]: t["id"] for t in tj.get("added_tokens", [])}
        self.pattern_json = self._find_split_regex(tj.get("pre_tokenizer"))
        self.pattern = self.pattern_json or O200K_PATTERN
        self.rx = regex.compile(self.pattern)
        self._cache = {}

    @staticmethod
    def _find_split_regex(pt):
        if not isinstance(pt, dict):
            return None
        if pt.get("type") == "Split":
            return pt.get("pattern", {}).get("Regex")
        for sub in pt.get("pretokenizers", []) or []:
            r = RefEncoder._find_split_regex(sub)
            if r:
                return r
        return None

    def ranks_sha256(self):
        lines = "".join(base64.b64encode(b).decode() + " " + str(i) + "\n"
                        for b, i in sorted(self.ranks.items(), key=lambda kv: kv[1]))
        return hashlib.sha256(lines.encode()).hexdigest()

    def _bpe(self, piece):
        r = self.ranks.get(piece)
        if r is not None:
            return [r]
        parts = [piece[i:i + 1] for i in range(len(piece))]
        while len(parts) > 1:
            best_i, best_r = -1, None
            for i in range(len(parts) - 1):
                r = self.ranks.get(parts[i] + parts[i + 1])
                if r is not None and (best_r is None or r < best_r):
                    best_i, best_r = i, r
            if best_r is None:
                break
            parts[best_i:best_i + 2] = [parts[best_i] + parts[best_i + 1]]
        return [self.ranks[p] for p in parts]

    def pieces(self, text):
        return [m.group(0) for m in self.rx.finditer(text)]

    def encode_ordinary(self, text):
        out = []
        for piece in self.pieces(text):
            b = piece.encode("utf-8")
            ids = self._cache.get(b)
            if ids is None:
                ids = self._bpe(b)
                if len(b) < 64:
                    self._cache[b] = ids
            out.extend(ids)
        return out

    def decode_bytes(self, ids):
        return b"".join(self.decoder[i] for i in ids)
