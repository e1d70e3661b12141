#!/usr/bin/python3
"""Unit tests for tools/train/{bpe,gguf_io,tokmap,corpus}.py. Standard library only; runs in
seconds: python3 tools/train/test_tools.py"""
import array
import collections
import math
import os
import random
import struct
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bpe  # noqa: E402
import gguf_io as G  # noqa: E402
import tokmap  # noqa: E402

SAMPLE = (
    "def fib(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n    a, b = 0, 1\n"
    "    for _ in range(n):\n        a, b = b, a + b\n    return a\n\n\n"
    "class Point:\n    def __init__(self, x=0.0, y=1234567):\n        self.x = x  # café\n"
    "        self.y = y\n\n    def __repr__(self):\n        return f'Point({self.x!r}, {self.y!r})'\n"
    "\tif x >= 10 and y != -3: print(\"ok\")\r\n  \n"
)


def f16_bits(x):
    return struct.unpack("<H", G.encode_f16([x]))[0]


def bf16_bits(x):
    return struct.unpack("<H", G.encode_bf16([x]))[0]


class TestPretokenizer(unittest.TestCase):
    def test_ascii_regex_equals_scanner(self):
        rnd = random.Random(7)
        alpha = "abXY09 \t\n\r\x0b\x0c\x00\x1c!#()_.,-'\"\\`~{}"
        for _ in range(3000):
            s = "".join(rnd.choice(alpha) for _ in range(rnd.randint(1, 24)))
            a = bpe.pretokenize(s)
            self.assertEqual("".join(a), s)
            self.assertEqual(a, bpe.pretokenize(s, force_scanner=True), repr(s))

    def test_known_splits(self):
        self.assertEqual(bpe.pretokenize("Hello world"), ["Hello", " world"])
        self.assertEqual(bpe.pretokenize("x = 12345"), ["x", " =", " ", "123", "45"])
        self.assertEqual(bpe.pretokenize("a  b\n\n  c"), ["a", " ", " b", "\n\n", " ", " c"])
        self.assertEqual(bpe.pretokenize("self.x"), ["self", ".x"])
        self.assertEqual(bpe.pretokenize("foo):\n    x"), ["foo", "):\n", "   ", " x"])
        # CJK run and an accented word (scanner path)
        self.assertEqual(bpe.pretokenize("日本語abc café"), ["日本語", "abc", " café"])


class TestBPE(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.v = bpe.train(SAMPLE * 3, 264 + 60)

    def test_layout(self):
        v = self.v
        self.assertEqual(len(v.tokens), 324)
        self.assertEqual(v.tokens[0], "<｜begin▁of▁sentence｜>")
        self.assertEqual(v.tokens[3], "!")
        self.assertEqual(v.tokens[3 + 255], bpe.BYTE_TO_CHAR[0xAD])  # last moved byte
        self.assertEqual(v.tokens[259:264], bpe.SPECIAL_TAIL)
        self.assertEqual(v.token_type[:3], [3, 3, 3])
        self.assertEqual(v.token_type[259:264], [3] * 5)
        self.assertEqual(len(v.merges), 60)
        self.assertEqual(bpe.BYTE_TO_CHAR[0x20], "Ġ")
        self.assertEqual(bpe.BYTE_TO_CHAR[0x0A], "Ċ")
        self.assertEqual(bpe.BYTE_TO_CHAR[0x00], "Ā")

    def test_round_trip(self):
        v = self.v
        for text in [SAMPLE, "ünïcödé ✓ 日本語 \x00\x7f", "", " ", "12345678"]:
            ids = v.encode(text)
            self.assertEqual(v.decode(ids), text.encode("utf-8"))
        self.assertLess(len(v.encode(SAMPLE)), len(SAMPLE.encode()) * 0.7)

    def test_special_tokens(self):
        v = self.v
        ids = v.encode("<｜User｜>hi<｜Assistant｜></think><｜DSML｜invoke name=\"f\">", add_bos=True)
        self.assertEqual(ids[0], 0)
        self.assertEqual(ids[1], 259)
        self.assertIn(260, ids)
        self.assertIn(262, ids)
        self.assertIn(263, ids)  # ｜DSML｜ inside the longer markup
        self.assertNotIn(261, ids)
        plain = v.encode("<think>", parse_special=False)
        self.assertNotIn(261, plain)

    def test_incremental_equals_naive(self):
        text = SAMPLE
        v = bpe.train(text, 264 + 40)
        # naive trainer: recount all pairs each step
        words = collections.Counter(bpe.count_pretokens(text))
        seqs = {w: [bpe.BYTE_TO_CHAR[b] for b in w.encode()] for w in words}
        merges = []
        for _ in range(40):
            pc = collections.Counter()
            for w, c in words.items():
                s = seqs[w]
                for p in zip(s, s[1:]):
                    pc[p] += c
            best = min(pc.items(), key=lambda kv: (-kv[1], kv[0]))[0]
            merges.append(best[0] + " " + best[1])
            for w in seqs:
                s, out, k = seqs[w], [], 0
                while k < len(s):
                    if k + 1 < len(s) and (s[k], s[k + 1]) == best:
                        out.append(s[k] + s[k + 1])
                        k += 2
                    else:
                        out.append(s[k])
                        k += 1
                seqs[w] = out
        self.assertEqual(v.merges, merges)


class TestCodecs(unittest.TestCase):
    def test_f16_known(self):
        self.assertEqual(f16_bits(1.0), 0x3C00)
        self.assertEqual(f16_bits(-0.0), 0x8000)
        self.assertEqual(f16_bits(65504.0), 0x7BFF)
        self.assertEqual(f16_bits(65519.0), 0x7BFF)
        self.assertEqual(f16_bits(65520.0), 0x7C00)
        self.assertEqual(f16_bits(1e10), 0x7C00)
        self.assertEqual(f16_bits(-math.inf), 0xFC00)
        self.assertEqual(f16_bits(math.nan), 0x7E00)
        self.assertEqual(f16_bits(2.0 ** -24), 0x0001)
        self.assertEqual(f16_bits(2.0 ** -25), 0x0000)      # tie -> even
        self.assertEqual(f16_bits(3 * 2.0 ** -25), 0x0002)  # tie -> even
        self.assertEqual(f16_bits(1 + 2.0 ** -11), 0x3C00)  # tie -> even
        self.assertEqual(f16_bits(1 + 3 * 2.0 ** -11), 0x3C02)
        xs = [random.Random(1).uniform(-70000, 70000) for _ in range(200)]
        for x, y in zip(xs, G.decode_f16(G.encode_f16(xs))):
            if abs(x) < 65504:
                self.assertLessEqual(abs(x - y), abs(x) * 2 ** -11 + 1e-7)

    def test_bf16_known(self):
        self.assertEqual(bf16_bits(1.0), 0x3F80)
        self.assertEqual(bf16_bits(1 + 2.0 ** -8), 0x3F80)
        self.assertEqual(bf16_bits(1 + 3 * 2.0 ** -8), 0x3F82)
        self.assertEqual(bf16_bits(-2.0), 0xC000)
        self.assertEqual(bf16_bits(math.inf), 0x7F80)
        self.assertEqual(bf16_bits(math.nan), 0x7FC0)
        self.assertEqual(G.decode_bf16(G.encode_bf16([3.140625])), [3.140625])

    def test_q8_0_known(self):
        # amax 127 -> d = 1, id = 1: the codes are x rounded half AWAY from zero
        x = [127.0, 2.5, -2.5, 0.5, -0.5, 1.5, 0.49, -126.6] + [0.0] * 24
        b = G.encode_q8_0(x)
        self.assertEqual(len(b), 34)
        self.assertEqual(b[:2], b"\x00\x3c")
        self.assertEqual(list(struct.unpack("<8b", b[2:10])), [127, 3, -3, 1, -1, 2, 0, -127])
        self.assertEqual(G.encode_q8_0([0.0] * 32), bytes(34))
        rnd = random.Random(3)
        xs = [rnd.gauss(0, 0.02) for _ in range(32 * 50)]
        ys = G.decode_q8_0(G.encode_q8_0(xs))
        for i in range(0, len(xs), 32):
            amax = max(abs(v) for v in xs[i:i + 32])
            for a, c in zip(xs[i:i + 32], ys[i:i + 32]):
                self.assertLessEqual(abs(a - c), amax / 127 * 0.51 + amax * 1e-3)

    def test_engram_known(self):
        hd = 32
        b = G.encode_engram_rows([448.0] * hd, hd)
        self.assertEqual(len(b), 33)
        self.assertEqual(b[:32], bytes([0x7E]) * 32)
        self.assertEqual(b[32], 127)
        b = G.encode_engram_rows([1.0] * 16 + [-1.0] * 16, hd)
        self.assertEqual(b[32], 119)                 # 2^-8: 1.0 <= 448 / 256
        self.assertEqual(b[:16], bytes([0x78]) * 16)  # 256 = 2^8 in E4M3
        self.assertEqual(b[16:32], bytes([0xF8]) * 16)
        self.assertEqual(G.decode_engram_rows(b, hd), [1.0] * 16 + [-1.0] * 16)
        z = G.encode_engram_rows([0.0] * 64, 64)
        self.assertEqual(list(z[64:]), [105, 105])  # amax clamped to 1e-4 -> 2^-22
        rnd = random.Random(5)
        xs = [rnd.gauss(0, 1) * (10 ** rnd.randint(-3, 3)) for _ in range(256 * 4)]
        enc = G.encode_engram_rows(xs, 256)
        self.assertEqual(len(enc), 264 * 4)
        for r in range(4):
            row = enc[264 * r:264 * (r + 1)]
            self.assertTrue(all((c & 0x7F) != 0x7F for c in row[:256]))
            self.assertTrue(all(s != 255 for s in row[256:]))
        ys = G.decode_engram_rows(enc, 256)
        for k in range(0, len(xs), 32):
            amax = max(abs(v) for v in xs[k:k + 32])
            for a, c in zip(xs[k:k + 32], ys[k:k + 32]):
                # E4M3: 3 mantissa bits (rel. 1/16) plus subnormal step 2^-9 * scale, plus bf16
                self.assertLessEqual(abs(a - c), abs(a) / 15 + amax / 448 * 2 ** -9 * 2 + 1e-30)

    def test_e4m3_encoder(self):
        for c in range(256):
            if (c & 0x7F) == 0x7F:
                continue
            self.assertEqual(G.f32_to_e4m3(G.e4m3_to_float(c)), c if c != 0x80 else 0x80)
        self.assertEqual(G.f32_to_e4m3(464.0), 0x7E)  # would round to NaN without saturation
        self.assertEqual(G.f32_to_e4m3(1e9), 0x7E)

    @unittest.skipIf(G.np is None, "numpy not available")
    def test_numpy_paths_equal_python(self):
        np = G.np
        rnd = np.random.default_rng(0)
        x = (rnd.standard_normal(32 * 64) * 0.05).astype(np.float32)
        x[:3] = [2.5, -2.5, 65520.0]
        for enc in (G.encode_f16, G.encode_bf16, G.encode_q8_0, G.encode_f32):
            self.assertEqual(enc(x), enc(array.array("f", x.tobytes())), enc.__name__)
        e = (rnd.standard_normal(256 * 8) * 10.0 ** rnd.integers(-6, 4, 256 * 8)).astype(np.float32)
        e[:40] = [448, -448, 464, 1e-9, 0, -0.0, 2 ** -9, 3 * 2 ** -10] + [1.0] * 32
        e[256:288] = 0
        self.assertEqual(G.encode_engram_rows(e, 256),
                         G.encode_engram_rows(array.array("f", e.tobytes()), 256))
        self.assertEqual(G.encode_engram_rows(e, 32),
                         G.encode_engram_rows(array.array("f", e.tobytes()), 32))


class TestGGUF(unittest.TestCase):
    def test_write_read_patch(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "t.gguf")
            vals = [float(i) - 40 for i in range(64)]
            G.write_gguf(p, [
                ("general.name", G.STRING, "test"),
                ("a.u32", G.U32, 7), ("a.f32", G.F32V, 1.5), ("a.bool", G.BOOL, True),
                ("a.i32s", G.ARRAY, (G.I32, [1, -2, 3])),
                ("a.strs", G.ARRAY, (G.STRING, ["x", "ÿ", ""])),
                ("a.u64s", G.ARRAY, (G.U64, [2 ** 40])),
            ], tensors=[
                ("w.f32", [32, 2], G.T_F32, G.encode_f32(vals)),
                ("w.q8", [64], G.T_Q8_0, G.encode_q8_0(vals)),
                ("w.bf16", [3], G.T_BF16, G.encode_bf16([1, 2, 3])),
            ], alignment=64)
            g = G.read_gguf(p)
            self.assertEqual(g.alignment, 64)
            self.assertEqual(g.kv["general.alignment"], 64)
            self.assertEqual(g.kv["a.u32"], 7)
            self.assertEqual(g.kv["a.f32"], 1.5)
            self.assertIs(g.kv["a.bool"], True)
            self.assertEqual(g.kv["a.i32s"], [1, -2, 3])
            self.assertEqual(g.kv["a.strs"], ["x", "ÿ", ""])
            self.assertEqual(g.kv["a.u64s"], [2 ** 40])
            self.assertEqual(g.kv_types["a.i32s"], (G.ARRAY, G.I32))
            self.assertEqual([t.name for t in g.tensors], ["w.f32", "w.q8", "w.bf16"])
            self.assertEqual(g.data_offset % 64, 0)
            for t in g.tensors:
                self.assertEqual(t.offset % 64, 0)
            self.assertEqual(g.tensor("w.q8").nbytes, 68)
            self.assertEqual(G.decode_f32(g.read_tensor_bytes("w.f32")), vals)
            self.assertEqual(G.decode_q8_0(g.read_tensor_bytes("w.q8")),
                             G.decode_q8_0(G.encode_q8_0(vals)))
            G.patch_tensor(p, "w.bf16", G.encode_bf16([4, 5, 6]))
            self.assertEqual(G.decode_bf16(G.read_gguf(p).read_tensor_bytes("w.bf16")), [4, 5, 6])
            with self.assertRaises(ValueError):
                G.patch_tensor(p, "w.bf16", b"\0" * 4)
            self.assertEqual(os.path.getsize(p) % 64, 0)

    def test_vocab_gguf(self):
        v = bpe.train(SAMPLE, 270)
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "v.gguf")
            G.write_vocab_gguf(p, v.tokens, v.token_type, v.merges)
            g = G.read_gguf(p)
            self.assertEqual(g.kv["tokenizer.ggml.model"], "gpt2")
            self.assertEqual(g.kv["tokenizer.ggml.pre"], "joyai-llm")
            self.assertEqual(g.kv["tokenizer.ggml.tokens"], v.tokens)
            self.assertEqual(g.kv["tokenizer.ggml.token_type"], v.token_type)
            self.assertEqual(g.kv_types["tokenizer.ggml.token_type"], (G.ARRAY, G.I32))
            self.assertEqual(g.kv["tokenizer.ggml.merges"], v.merges)
            self.assertEqual(g.kv["tokenizer.ggml.bos_token_id"], 0)
            self.assertIs(g.kv["tokenizer.ggml.add_bos_token"], True)
            self.assertEqual(g.tensors, [])


class TestTokmap(unittest.TestCase):
    def test_normalize(self):
        self.assertEqual(tokmap.normalize(" The"), "the")
        self.assertEqual(tokmap.normalize("Café"), "cafe")
        self.assertEqual(tokmap.normalize(" "), " ")
        self.assertEqual(tokmap.normalize("\n\n"), " ")
        self.assertEqual(tokmap.normalize("  x\t"), "x")
        self.assertEqual(tokmap.normalize("ﬁ"), "fi")  # NFKC

    def test_map(self):
        toks, types = bpe.fixed_vocab()
        toks += ["ĠThe", "the", "THE", "Ġ", "ĊĊ", "Ã"]
        types += [1] * 6
        m, n = tokmap.token_map(toks, types)
        self.assertEqual(m[:3], [0, 1, 2])
        self.assertEqual(m[-6], m[-5])
        self.assertEqual(m[-5], m[-4])
        self.assertEqual(m[-3], m[-2])  # " " and "\n\n" both key " "
        # "Ã" alone is byte 0xC3: invalid UTF-8 -> keyed by its raw token string, which is also
        # the key of... nothing else here, and differs from the key "ã" of the text "ã"
        self.assertEqual(len(set(m)), n)
        self.assertEqual(max(m), n - 1)


if __name__ == "__main__":
    unittest.main(verbosity=1)
