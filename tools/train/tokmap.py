#!/usr/bin/python3
"""Engram compressed token map for a byte-level BPE vocabulary (spec 4.2; DeepSeek's engram.py
compressed_token_map), standard library only.

For every raw id in increasing order: decode the single token (byte tokens -> their bytes ->
UTF-8 with U+FFFD for invalid bytes, as the HF ByteLevel decoder's from_utf8_lossy; control
tokens -> their own text). If the text contains U+FFFD the key is the raw token string.
Otherwise key = normalize(text), or the text itself when that is empty, where normalize is the
HF normalizer sequence
  NFKC -> NFD -> StripAccents (drop category Mn) -> lowercase -> [ \\t\\r\\n]+ -> " "
  -> "^ $" -> U+E000 -> Strip (Unicode White_Space at both ends) -> U+E000 -> " ".
Compressed ids are numbered in order of first appearance of the key.

Output JSON: {"engram_token_map": [...], "engram_compressed_vocab_size": N,
"engram_pad_token_id": 2} -- the keys of the model config JSON (src/model/deepseek41/config.cpp;
engram_pad_token_id is a RAW id, the engine uses token_map[it]).

CLI: python3 tools/train/tokmap.py --vocab DIR/vocab.json [--out tokmap.json]
     (--vocab may also be a vocabulary GGUF)
"""
import argparse
import json
import re
import sys
import unicodedata
import os

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402

# Unicode White_Space (what Rust's char::is_whitespace, used by HF's Strip, accepts).
_WHITE = "".join(chr(c) for c in sorted(bpe._WHITE))
_RUNS = re.compile(r"[ \t\r\n]+")


def normalize(text):
    s = unicodedata.normalize("NFKC", text)
    s = unicodedata.normalize("NFD", s)
    s = "".join(ch for ch in s if unicodedata.category(ch) != "Mn")
    s = s.lower()
    s = _RUNS.sub(" ", s)
    if s == " ":
        s = "\ue000"
    s = s.strip(_WHITE)
    return s.replace("\ue000", " ")


def token_key(token, ttype):
    text = bpe.token_bytes(token, ttype).decode("utf-8", errors="replace")
    if "\ufffd" in text:
        return token
    return normalize(text) or text


def token_map(tokens, token_types):
    keys = {}
    out = []
    for tok, ty in zip(tokens, token_types):
        k = token_key(tok, ty)
        out.append(keys.setdefault(k, len(keys)))
    return out, len(keys)


def load_vocab(path):
    if path.endswith(".gguf"):
        import gguf_io
        g = gguf_io.read_gguf(path)
        return g.kv["tokenizer.ggml.tokens"], g.kv["tokenizer.ggml.token_type"]
    with open(path, encoding="utf-8") as f:
        d = json.load(f)
    return d["tokens"], d["token_type"]


def main(argv=None):
    ap = argparse.ArgumentParser(description="Engram compressed token map (spec 4.2)")
    ap.add_argument("--vocab", required=True, help="vocab.json or vocabulary GGUF")
    ap.add_argument("--out", help="output JSON (default: stdout)")
    a = ap.parse_args(argv)
    tokens, types = load_vocab(a.vocab)
    m, n = token_map(tokens, types)
    doc = {"engram_token_map": m, "engram_compressed_vocab_size": n, "engram_pad_token_id": 2}
    s = json.dumps(doc, separators=(",", ":")) + "\n"
    if a.out:
        with open(a.out, "w") as f:
            f.write(s)
    else:
        sys.stdout.write(s)
    print("vocab %d -> compressed %d (pad: token_map[2] = %d)" % (len(tokens), n, m[2]),
          file=sys.stderr)


if __name__ == "__main__":
    main()
