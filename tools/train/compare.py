"""sluice's logits on a shipped model against the trainer's reference file (export.py).

    /usr/bin/python3 tools/train/compare.py --model models/NAME.gguf --ref models/NAME.ref.json

Prints, per reference sequence and over all, the top-1 agreement and the perplexity of the
next tokens under each side. The engine's own test (tests/trained_model_test.cpp) makes the same
comparison without Python; this script is for the trainer's loop.
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def sluice_logits(sluice, model, tokens):
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "logits.f32")
        subprocess.run([sluice, "run", "-m", model, "--tokens", ",".join(map(str, tokens)), "-n", "0",
                        "--dump-logits", out], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        return np.fromfile(out, dtype=np.float32).reshape(len(tokens), -1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default=os.path.join(HERE, "..", "..", "build", "sluice"))
    ap.add_argument("--model", required=True)
    ap.add_argument("--ref", required=True)
    a = ap.parse_args(argv)
    ref = json.load(open(a.ref))
    agree = n = 0
    nll_s = nll_r = 0.0
    for i, seq in enumerate(ref["sequences"]):
        lg = sluice_logits(a.sluice, a.model, seq["tokens"]).astype(np.float64)
        lse = np.log(np.exp(lg - lg.max(1, keepdims=True)).sum(1)) + lg.max(1)
        nxt = np.array(seq["next"])
        lp = lg[np.arange(len(nxt)), nxt] - lse
        am = lg.argmax(1)
        a_seq = int((am == np.array(seq["argmax"])).sum())
        print("sequence %d: top-1 agreement %d/%d, ppl sluice %.4f trainer %.4f" % (
            i, a_seq, len(nxt), math.exp(-lp.mean()), math.exp(-np.mean(seq["logprob"]))))
        agree += a_seq
        n += len(nxt)
        nll_s += -lp.sum()
        nll_r += -np.sum(seq["logprob"])
    print("all: top-1 agreement %.4f, ppl sluice %.4f trainer %.4f (ratio %.5f)" % (
        agree / n, math.exp(nll_s / n), math.exp(nll_r / n), math.exp((nll_s - nll_r) / n)))


if __name__ == "__main__":
    sys.exit(main())
