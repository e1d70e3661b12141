#!/usr/bin/python3
"""Checks tools/train's tokenizer and tensor codecs against the sluice binary (issue 52).

  python3 tools/train/check_sluice.py --sluice build/sluice --vocab DIR [--text heldout.txt]

1. Tokenization: `sluice tokenize -m DIR/vocab.gguf --ids --no-bos` on --text and on random
   Unicode strings vs bpe.Vocab.encode (must be identical).
2. Codecs: makes a model with `sluice make-model` (configs/tiny.json with this vocabulary,
   attn tensors BF16), and for one tensor of each type F32, F16, BF16, Q8_0 and an Engram table
   (I8 rows) checks (a) our decoder on sluice's own random payload == `sluice dump-tensor`, and
   (b) after patch_tensor with our encoder's payload (pure-Python path and, when numpy is
   present, numpy path), our decoder == `sluice dump-tensor`, bit for bit.
3. Encoders (--cxx, needs g++ and BUILD/libsluice_kernels.a): a tiny C++ program calls
   sluice's own quantize_row_q8_0, f32_to_f16, f32_to_bf16, f32_to_e4m3 on 640k values
   (random magnitudes 1e-8..1e5, exact rounding ties, zeros, overflow edges); our encoders
   (pure Python and numpy) must give the same bytes.
"""
import argparse
import array
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bpe  # noqa: E402
import gguf_io as G  # noqa: E402
import tokmap  # noqa: E402


def sluice_ids(sluice, vocab_gguf, data):
    out = subprocess.run([sluice, "tokenize", "-m", vocab_gguf, "--ids", "--no-bos"], input=data,
                         capture_output=True, check=True).stdout
    return [int(x) for x in out.split()]


def check_tokenizer(sluice, vdir, text_path, n_random):
    v = bpe.Vocab.load(os.path.join(vdir, "vocab.json"))
    gg = os.path.join(vdir, "vocab.gguf")
    ok = True
    if text_path:
        data = open(text_path, "rb").read()
        a, b = sluice_ids(sluice, gg, data), v.encode(data.decode("utf-8"))
        same = sum(x == y for x, y in zip(a, b))
        print("tokenize %s: sluice %d ids, python %d ids, identical: %s (%d positions agree)" % (
            text_path, len(a), len(b), a == b, same))
        ok &= a == b
    rnd = random.Random(11)
    pool = list("aZ09 \t\n\r_.(')é日本カナ한글١٢٣ⅻ½\u0301\u0308\u00a0\u3000\u2028ÄßΩж😀\x00\x1c✓€+<>") + \
        ["<think>", "｜DSML｜", "<｜User｜>"]
    bad = 0
    for _ in range(n_random):
        s = "".join(rnd.choice(pool) for _ in range(rnd.randint(1, 40)))
        bad += sluice_ids(sluice, gg, s.encode()) != v.encode(s)
    print("tokenize %d random Unicode strings: %d mismatches" % (n_random, bad))
    return ok and bad == 0


def test_values(n, rnd, scale=1.0):
    vals = []
    specials = [0.0, -0.0, 2.5, -2.5, 0.5, 1e-8, 65504.0, 65520.0, 1 + 2 ** -11, 1 + 2 ** -8,
                3 * 2 ** -25, 448.0, 464.0, -1e-30]
    for i in range(n):
        r = rnd.random()
        if r < 0.05:
            vals.append(rnd.choice(specials))
        else:
            vals.append(rnd.gauss(0, 1) * scale * 10 ** rnd.randint(-4, 2))
    return vals


def dump(sluice, path, name, tmpdir):
    out = os.path.join(tmpdir, "dump.f32")
    subprocess.run([sluice, "dump-tensor", path, name, out, "--force"], check=True,
                   capture_output=True)
    with open(out, "rb") as f:
        return f.read()


def f32_bytes(vals):
    return array.array("f", vals).tobytes()


def check_codecs(sluice, vdir, tmpdir):
    cfg = json.load(open(os.path.join(HERE, "..", "..", "configs", "tiny.json")))
    v = bpe.Vocab.load(os.path.join(vdir, "vocab.json"))
    m, n = tokmap.token_map(v.tokens, v.token_type)
    cfg.update(vocab_size=len(v.tokens), engram_token_map=m, engram_compressed_vocab_size=n,
               sluice_tensor_types={"attn": "BF16"})
    cpath = os.path.join(tmpdir, "cfg.json")
    json.dump(cfg, open(cpath, "w"))
    model = os.path.join(tmpdir, "x.gguf")
    subprocess.run([sluice, "make-model", "--config", cpath, "--vocab",
                    os.path.join(vdir, "vocab.gguf"), "-o", model, "--force"], check=True,
                   capture_output=True)
    g = G.read_gguf(model)
    picks = {}  # the first and the last tensor of each kind
    for t in g.tensors:
        kind = "ENGRAM" if t.name.endswith(".engram_embd.weight") else t.type_name
        if kind in ("F32", "F16", "BF16", "Q8_0", "ENGRAM"):
            picks.setdefault(kind + ":first", t)
            picks[kind + ":last"] = t
    picks = {k: t for k, t in picks.items() if k.endswith(":first") or picks[k.split(":")[0] + ":first"] is not t}
    rnd = random.Random(5)
    ok = True
    for key, t in sorted(picks.items()):
        kind = key.split(":")[0]
        nelem = 1
        for d in t.ne:
            nelem *= d
        hd = cfg["engram_head_dim"]
        if kind == "ENGRAM":
            dec = lambda b: G.decode_engram_rows(b, hd)
            enc = lambda x: G.encode_engram_rows(x, hd)
            nvals = t.ne[1] * hd
        else:
            dec, enc, nvals = G.DECODERS[kind], G.ENCODERS[kind], nelem
        orig = g.read_tensor_bytes(t.name)
        r0 = dump(sluice, model, t.name, tmpdir) == f32_bytes(dec(orig))
        vals = test_values(nvals, rnd)
        payload = enc(vals)
        G.patch_tensor(model, t.name, payload)
        r1 = dump(sluice, model, t.name, tmpdir) == f32_bytes(dec(payload))
        r2 = None
        if G.np is not None:
            payload_np = enc(G.np.array(vals, dtype=G.np.float32))
            r2 = payload_np == payload
        print("%-30s %-8s ne=%-14s sluice payload decode==dump: %s; our encode -> patch -> dump"
              " == our decode: %s; numpy encode == python encode: %s" % (
                  t.name, kind, t.ne, r0, r1, r2))
        ok &= r0 and r1 and r2 is not False
    return ok


CXX = r"""
#include <cstdio>
#include <vector>
#include "kernels/groups.h"
#include "kernels/fp.h"
int main() {
  std::vector<float> x;
  float f;
  while (fread(&f, 4, 1, stdin) == 1) x.push_back(f);
  size_t n = x.size() / 32 * 32;
  std::vector<uint8_t> q(n / 32 * 34);
  sluice::quantize_row_q8_0(x.data(), q.data(), (int64_t)n);
  fwrite(q.data(), 1, q.size(), stdout);
  for (float v : x) { uint16_t h = sluice::f32_to_f16(v); fwrite(&h, 2, 1, stdout); }
  for (float v : x) { uint16_t h = sluice::f32_to_bf16(v); fwrite(&h, 2, 1, stdout); }
  for (float v : x) { uint8_t c = sluice::f32_to_e4m3(v); fwrite(&c, 1, 1, stdout); }
}
"""


def check_encoders_cxx(build, tmpdir):
    src = os.path.join(tmpdir, "q.cpp")
    exe = os.path.join(tmpdir, "q")
    open(src, "w").write(CXX)
    root = os.path.join(HERE, "..", "..")
    subprocess.run(["g++", "-std=c++20", "-O1", "-I" + os.path.join(root, "src"), src,
                    os.path.join(build, "libsluice_kernels.a"), os.path.join(build, "libsluice_util.a"),
                    "-o", exe], check=True)
    rnd = random.Random(9)
    vals = []
    edge = [65504.0, 65519.0, 65520.0, 1e-8, 2 ** -25, 3 * 2 ** -25, 1 + 2 ** -11, 1 + 2 ** -8,
            1 + 3 * 2 ** -8, -0.0, 448.0, 464.0, 2 ** -10, 3 * 2 ** -10, 2 ** -7]
    for _ in range(20000):
        kind = rnd.random()
        s = 10 ** rnd.uniform(-8, 5)
        if kind < 0.2:    # exact .5 ties of x * id (amax 127 -> d = id = 1)
            b = [rnd.randint(-254, 254) / 2 for _ in range(31)] + [127.0]
        elif kind < 0.3:
            b = [0.0] * 32
        elif kind < 0.4:
            b = [rnd.choice(edge) for _ in range(32)]
        else:
            b = [rnd.gauss(0, 1) * s for _ in range(32)]
        vals += b
    a = array.array("f", vals)
    out = subprocess.run([exe], input=a.tobytes(), capture_output=True, check=True).stdout
    n = len(a)
    qb = n // 32 * 34
    ref = {"Q8_0": out[:qb], "F16": out[qb:qb + 2 * n], "BF16": out[qb + 2 * n:qb + 4 * n],
           "E4M3": out[qb + 4 * n:]}
    ok = True
    for name, enc in (("Q8_0", G.encode_q8_0), ("F16", G.encode_f16), ("BF16", G.encode_bf16),
                      ("E4M3", lambda x: bytes(G.f32_to_e4m3(v) for v in x))):
        r = {"python": enc(a) == ref[name]}
        if G.np is not None:
            xn = G.np.frombuffer(a.tobytes(), dtype=G.np.float32)
            r["numpy"] = (G._f32_to_e4m3_np(xn).tobytes() if name == "E4M3" else enc(xn)) == ref[name]
        print("encoder %-5s vs sluice's C++ on %d values: %s" % (name, n, r))
        ok &= all(r.values())
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sluice", default=os.path.join(HERE, "..", "..", "build", "sluice"))
    ap.add_argument("--vocab", required=True, help="directory with vocab.json and vocab.gguf")
    ap.add_argument("--text", help="text to tokenize with both (e.g. heldout.txt)")
    ap.add_argument("--random", type=int, default=300)
    ap.add_argument("--cxx", action="store_true", help="also compare encoders with sluice's C++")
    ap.add_argument("--build", default=os.path.join(HERE, "..", "..", "build"))
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ok = check_tokenizer(a.sluice, a.vocab, a.text, a.random)
        ok &= check_codecs(a.sluice, a.vocab, tmp)
        if a.cxx:
            ok &= check_encoders_cxx(a.build, tmp)
    print("ALL OK" if ok else "MISMATCH")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
