#!/usr/bin/python3
"""Byte-level BPE trainer and encoder for the small trained deepseek41 model (issue 52).

Standard library only. The encoder reproduces sluice's tokenizer (src/text/tokenizer.cpp,
pretokenize.cpp) so the trainer can check its data against `sluice tokenize`.

Pre-tokenizer: "joyai-llm" (spec section 5), three ordered passes, each splitting the pieces
of the previous one and keeping both matches and gaps:
  1. \\p{N}{1,3}   2. [一-龥぀-ゟ゠-ヿ]+   3. the word/punctuation/space regex.
Pure-ASCII pieces go through Python `re` patterns that are exact for ASCII (the classes
written out: \\p{L} = [A-Za-z], \\p{N} = [0-9], \\p{P}|\\p{S} = the 32 ASCII punctuation
characters, \\p{M} = none, \\s = [\\t\\n\\v\\f\\r ]); any piece with a non-ASCII character goes
through a port of sluice's hand-written scanner with categories from `unicodedata` (Python 3.11
ships Unicode 14; sluice uses the system ICU, so a code point whose category changed between
the two versions could split differently -- not seen in this corpus, which is nearly all ASCII).

Vocabulary layout (mirrors synthetic_vocab in src/synth/vocab.cpp for the fixed part):
  0, 1, 2    <｜begin▁of▁sentence｜>, <｜end▁of▁sentence｜>, <｜▁pad▁｜>            type 3
  3 .. 258   the 256 GPT-2 byte tokens in bytes_to_unicode order ("!" is 3)        type 1
  259 .. 263 <｜User｜>, <｜Assistant｜>, <think>, </think>, ｜DSML｜                 type 3
  264 ..     learned merges, in merge order, until the vocabulary has --vocab-size tokens
The chat renderer's other markup (<｜DSML｜tool_calls>, </｜DSML｜invoke>, <tool_result>, ...)
is ordinary text around the control token ｜DSML｜, which sluice matches anywhere (added tokens are
cut out before pre-tokenization), so these five are all the chat format needs.

Training: pre-token counts over the text; merges chosen greedily by pair frequency (ties: the
lexicographically smallest (left, right) pair of token strings); counts updated incrementally
over the unique words. A merge whose result string already exists (two different pairs can
spell the same string) is recorded as a merge but adds no token.

Encoding (as sluice): control tokens are cut out first (leftmost-longest, parse_special), the
rest pre-tokenized, each piece's bytes mapped to byte tokens and merged by lowest merge rank,
leftmost on ties, one merge at a time.

CLI:
  python3 tools/train/bpe.py --train train.txt --vocab-size 4096 --out DIR
      -> DIR/vocab.json (tokens, token_type, merges), DIR/vocab.gguf (for sluice --vocab)
  python3 tools/train/bpe.py --vocab DIR/vocab.json --encode FILE [--bos]   (ids on stdout)
"""
import argparse
import collections
import heapq
import json
import os
import re
import sys
import time
import unicodedata

# ---- GPT-2 byte <-> unicode ------------------------------------------------------------------


def _printable_byte(b):
    return (0x21 <= b <= 0x7E) or (0xA1 <= b <= 0xAC) or (0xAE <= b <= 0xFF)


def bytes_to_unicode():
    """byte value -> one-character string, as GPT-2 / vocab.cpp gpt2_byte_token."""
    m, moved = {}, 0
    for b in range(256):
        if _printable_byte(b):
            m[b] = chr(b)
        else:
            m[b] = chr(256 + moved)
            moved += 1
    return m


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}
# bytes_to_unicode order: the printable bytes first, then the others (vocab.cpp byte_order()).
BYTE_ORDER = [b for b in range(256) if _printable_byte(b)] + \
             [b for b in range(256) if not _printable_byte(b)]

SPECIAL_HEAD = ["<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"]
SPECIAL_TAIL = ["<｜User｜>", "<｜Assistant｜>", "<think>", "</think>", "｜DSML｜"]
N_FIXED = len(SPECIAL_HEAD) + 256 + len(SPECIAL_TAIL)  # 264
CONTROL, NORMAL = 3, 1


def fixed_vocab():
    tokens = list(SPECIAL_HEAD) + [BYTE_TO_CHAR[b] for b in BYTE_ORDER] + list(SPECIAL_TAIL)
    types = [CONTROL] * 3 + [NORMAL] * 256 + [CONTROL] * len(SPECIAL_TAIL)
    return tokens, types


def token_bytes(tok, ttype=NORMAL):
    """The bytes a token stands for (control tokens: their own UTF-8, as sluice)."""
    if ttype != NORMAL and ttype != 6:
        return tok.encode("utf-8")
    out = bytearray()
    for ch in tok:
        b = CHAR_TO_BYTE.get(ch)
        if b is None:
            out += ch.encode("utf-8")
        else:
            out.append(b)
    return bytes(out)


# ---- pre-tokenizer ---------------------------------------------------------------------------

_PUNCT = r"!-/:-@\[-`{-~"          # the 32 ASCII P/S characters
_WS = r"\t\n\x0b\x0c\r "            # Unicode White_Space within ASCII
_RE_DIGITS = re.compile(r"[0-9]{1,3}")
_RE_WORDS = re.compile(
    "[" + _PUNCT + "][A-Za-z]+"
    "|[^\\r\\nA-Za-z" + _PUNCT + "]?[A-Za-z]+"
    "| ?[" + _PUNCT + "]+[\\r\\n]*"
    "|[" + _WS + "]*[\\r\\n]+"
    "|[" + _WS + "]+(?![^" + _WS + "])"
    "|[" + _WS + "]+")


def _split_re(rx, s, out):
    gap = 0
    for m in rx.finditer(s):
        if m.start() > gap:
            out.append(s[gap:m.start()])
        out.append(m.group())
        gap = m.end()
    if gap < len(s):
        out.append(s[gap:])


def _pretok_ascii(s, out):
    p1 = []
    _split_re(_RE_DIGITS, s, p1)
    for piece in p1:           # pass 2 (CJK) has nothing to split in ASCII text
        _split_re(_RE_WORDS, piece, out)


# Unicode scanner: category bits as sluice's pretokenize.cpp.
kL, kM, kN, kPS, kWS, kCRLF, kCJK, kAP = 1, 2, 4, 8, 16, 32, 64, 128
_WHITE = set([0x85, 0xA0, 0x1680, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000] +
             list(range(0x09, 0x0E)) + [0x20] + list(range(0x2000, 0x200B)))


def _cat(ch):
    cp = ord(ch)
    c = 0
    g = unicodedata.category(ch)
    if g[0] == "L":
        c |= kL
    elif g[0] == "M":
        c |= kM
    elif g[0] == "N":
        c |= kN
    elif g[0] in "PS":
        c |= kPS
        if cp < 0x80:
            c |= kAP
    if cp in _WHITE:
        c |= kWS
    if ch in "\r\n":
        c |= kCRLF
    if 0x4E00 <= cp <= 0x9FA5 or 0x3040 <= cp <= 0x30FF:
        c |= kCJK
    return c


def _split_scan(b, e, match, emit):
    gap = b
    i = b
    while i < e:
        m = match(i, e)
        if m == i:
            i += 1
            continue
        if gap < i:
            emit(gap, i)
        emit(i, m)
        i = gap = m
    if gap < e:
        emit(gap, e)


def _pretok_unicode(s, out):
    cat = [_cat(ch) for ch in s]
    alpha = [("A" <= ch <= "Z") or ("a" <= ch <= "z") for ch in s]

    def run(i, e, bits):
        while i < e and cat[i] & bits:
            i += 1
        return i

    def digits(i, e):
        j = i
        while j < e and j < i + 3 and cat[j] & kN:
            j += 1
        return j

    def cjk(i, e):
        return run(i, e, kCJK)

    def words(i, e):
        if cat[i] & kAP and i + 1 < e and alpha[i + 1]:
            j = i + 1
            while j < e and alpha[j]:
                j += 1
            return j
        if not cat[i] & (kCRLF | kL | kPS) and i + 1 < e and cat[i + 1] & (kL | kM):
            return run(i + 1, e, kL | kM)
        if cat[i] & (kL | kM):
            return run(i, e, kL | kM)
        j = i
        if s[i] == " " and j + 1 < e and cat[j + 1] & kPS:
            j += 1
        if cat[j] & kPS:
            j = run(j, e, kPS)
            return run(j, e, kCRLF)
        if not cat[i] & kWS:
            return i
        ws_end = run(i, e, kWS)
        for k in range(ws_end, i, -1):
            if cat[k - 1] & kCRLF:
                return k
        if ws_end == e:
            return ws_end
        if ws_end - i >= 2:
            return ws_end - 1
        return ws_end

    emit = lambda b, e: out.append(s[b:e])
    pass3 = lambda b, e: _split_scan(b, e, words, emit)
    pass2 = lambda b, e: _split_scan(b, e, cjk, pass3)
    _split_scan(0, len(s), digits, pass2)


def pretokenize(s, out=None, force_scanner=False):
    """The pieces (str) of s, in order; they concatenate to s."""
    if out is None:
        out = []
    if not s:
        return out
    if s.isascii() and not force_scanner:
        _pretok_ascii(s, out)
    else:
        _pretok_unicode(s, out)
    return out


# ---- vocabulary / encoder --------------------------------------------------------------------

class Vocab:
    def __init__(self, tokens, token_type, merges):
        self.tokens = list(tokens)
        self.token_type = list(token_type)
        self.merges = list(merges)
        self.ids = {}
        for i, t in enumerate(self.tokens):
            self.ids.setdefault(t, i)
        self.ranks = {}
        for r, m in enumerate(self.merges):
            left, right = m.split(" ")
            key = (self.ids[left], self.ids[right])
            self.ranks.setdefault(key, (r, self.ids[left + right]))
        self.byte_id = [self.ids[BYTE_TO_CHAR[b]] for b in range(256)]
        self.bytes = [token_bytes(t, ty) for t, ty in zip(self.tokens, self.token_type)]
        self.added = sorted(((t, i) for i, (t, ty) in enumerate(zip(self.tokens, self.token_type))
                             if ty in (3, 4) and t), key=lambda x: -len(x[0].encode()))
        self._added_re = (re.compile("|".join(re.escape(t) for t, _ in self.added))
                          if self.added else None)
        self._added_id = {}
        for t, i in self.added:
            self._added_id.setdefault(t, i)
        self.cache = {}

    @classmethod
    def load(cls, path):
        with open(path, encoding="utf-8") as f:
            d = json.load(f)
        return cls(d["tokens"], d["token_type"], d["merges"])

    def bpe(self, piece):
        """ids of one pre-token piece (str)."""
        ids = self.cache.get(piece)
        if ids is not None:
            return ids
        syms = [self.byte_id[b] for b in piece.encode("utf-8")]
        ranks = self.ranks
        while len(syms) > 1:
            best = None
            for k in range(len(syms) - 1):
                m = ranks.get((syms[k], syms[k + 1]))
                if m is not None and (best is None or m[0] < best[0]):
                    best = (m[0], k, m[1])
            if best is None:
                break
            _, k, res = best
            syms[k:k + 2] = [res]
        self.cache[piece] = syms
        return syms

    def encode(self, text, add_bos=False, parse_special=True):
        out = [0] if add_bos else []
        pieces = []
        # Added (control) tokens: leftmost, longest at that position (the alternation is sorted
        # longest first; sluice's trie walk gives the same).
        segs = []
        if parse_special and self._added_re is not None:
            pos = 0
            for m in self._added_re.finditer(text):
                segs.append(text[pos:m.start()])
                segs.append(self._added_id[m.group()])
                pos = m.end()
            segs.append(text[pos:])
        else:
            segs = [text]
        for seg in segs:
            if isinstance(seg, int):
                out.append(seg)
                continue
            pieces.clear()
            pretokenize(seg, pieces)
            for p in pieces:
                out.extend(self.bpe(p))
        return out

    def decode(self, ids):
        return b"".join(self.bytes[i] for i in ids)


# ---- trainer ---------------------------------------------------------------------------------

def count_pretokens(text):
    counts = collections.Counter()
    pieces = []
    # Pre-tokenized per file: split just before corpus.py's "# file:" header lines. No piece of
    # the whole text crosses such a boundary ("\n" followed by "#"), so the counts are those of
    # the whole text; the chunks only keep the scanner's working set small.
    for chunk in re.split(r"(?m)^(?=# file: )", text):
        pieces.clear()
        pretokenize(chunk, pieces)
        counts.update(pieces)
    return counts


def train(text, vocab_size, log=None):
    tokens, types = fixed_vocab()
    if vocab_size < len(tokens):
        raise ValueError("vocab_size must be >= %d" % len(tokens))
    ids = {t: i for i, t in enumerate(tokens)}
    t0 = time.time()
    counts = count_pretokens(text)
    if log:
        log("pre-tokenized: %d pieces, %d unique (%.1fs)" % (sum(counts.values()), len(counts),
                                                             time.time() - t0))
    byte_id = {b: ids[BYTE_TO_CHAR[b]] for b in range(256)}
    words, freqs = [], []
    for piece, c in counts.items():
        w = [byte_id[b] for b in piece.encode("utf-8")]
        if len(w) > 1:
            words.append(w)
            freqs.append(c)
    pair_count = collections.defaultdict(int)
    pair_where = collections.defaultdict(set)
    for wi, w in enumerate(words):
        f = freqs[wi]
        for a, b in zip(w, w[1:]):
            pair_count[(a, b)] += f
            pair_where[(a, b)].add(wi)
    # Max-heap on (count, then smallest (left, right) strings): entries (-count, lstr, rstr, a, b);
    # stale entries (count changed) are skipped when popped.
    heap = [(-c, tokens[a], tokens[b], a, b) for (a, b), c in pair_count.items() if c > 0]
    heapq.heapify(heap)
    merges = []
    while len(tokens) < vocab_size and heap:
        negc, ls, rs, a, b = heapq.heappop(heap)
        c = pair_count.get((a, b), 0)
        if c <= 0:
            continue
        if -negc != c:  # stale: a fresher entry was pushed when the count changed
            continue
        new = ls + rs
        if new in ids:
            nid = ids[new]
        else:
            nid = len(tokens)
            tokens.append(new)
            types.append(NORMAL)
            ids[new] = nid
        merges.append(ls + " " + rs)
        changed = set()
        for wi in list(pair_where.get((a, b), ())):
            w = words[wi]
            f = freqs[wi]
            if len(w) < 2:
                continue
            # remove this word's old pairs
            for p in zip(w, w[1:]):
                pair_count[p] -= f
                changed.add(p)
            nw = []
            k = 0
            n = len(w)
            while k < n:
                if k + 1 < n and w[k] == a and w[k + 1] == b:
                    nw.append(nid)
                    k += 2
                else:
                    nw.append(w[k])
                    k += 1
            words[wi] = nw
            for p in set(zip(w, w[1:])):
                s = pair_where.get(p)
                if s is not None:
                    s.discard(wi)
            for p in zip(nw, nw[1:]):
                pair_count[p] += f
                pair_where[p].add(wi)
                changed.add(p)
        pair_count.pop((a, b), None)
        pair_where.pop((a, b), None)
        changed.discard((a, b))
        for p in changed:
            c2 = pair_count.get(p, 0)
            if c2 > 0:
                heapq.heappush(heap, (-c2, tokens[p[0]], tokens[p[1]], p[0], p[1]))
            else:
                pair_count.pop(p, None)
                pair_where.pop(p, None)
        if log and len(merges) % 500 == 0:
            log("merge %d: %r + %r (count %d), vocab %d, %.1fs" % (
                len(merges), ls, rs, c, len(tokens), time.time() - t0))
    if len(tokens) < vocab_size:
        raise ValueError("ran out of pairs at %d tokens (corpus too small)" % len(tokens))
    return Vocab(tokens, types, merges)


def save(v, out_dir):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import gguf_io
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "vocab.json"), "w", encoding="utf-8") as f:
        json.dump({"tokens": v.tokens, "token_type": v.token_type, "merges": v.merges}, f,
                  ensure_ascii=False, indent=0)
        f.write("\n")
    gguf_io.write_vocab_gguf(os.path.join(out_dir, "vocab.gguf"), v.tokens, v.token_type, v.merges,
                             name="sluice trained BPE %d" % len(v.tokens))


def main(argv=None):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description="byte-level BPE trainer / encoder (joyai-llm pre-tokenizer)")
    ap.add_argument("--train", help="training text (UTF-8)")
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--out", help="output directory (vocab.json, vocab.gguf)")
    ap.add_argument("--vocab", help="vocab.json to encode with")
    ap.add_argument("--encode", help="file to encode; prints ids space-separated")
    ap.add_argument("--bos", action="store_true", help="prepend BOS when encoding")
    a = ap.parse_args(argv)
    log = lambda m: print(m, file=sys.stderr, flush=True)
    if a.train:
        if not a.out:
            ap.error("--train needs --out")
        with open(a.train, encoding="utf-8") as f:
            text = f.read()
        v = train(text, a.vocab_size, log)
        save(v, a.out)
        log("wrote %s: %d tokens, %d merges" % (a.out, len(v.tokens), len(v.merges)))
    if a.encode:
        v = Vocab.load(a.vocab or os.path.join(a.out, "vocab.json"))
        with open(a.encode, "rb") as f:
            text = f.read().decode("utf-8")
        print(" ".join(map(str, v.encode(text, add_bos=a.bos))))


if __name__ == "__main__":
    main()
