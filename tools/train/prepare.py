"""Everything the trainer reads, from Debian's files and the engine: corpus, vocabulary, Engram
token map, the model's config, an initial GGUF made by `sluice make-model` (the schema's one
writer: export.py only overwrites its payload) and the token ids of both splits.

    /usr/bin/python3 tools/train/prepare.py --sluice build/sluice --out WORK
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bpe  # noqa: E402
import corpus  # noqa: E402
import gguf_io  # noqa: E402
import tokmap  # noqa: E402


def hashing_of(gguf_path):
    """The Engram hashing parameters the engine wrote (primes and multipliers are its own)."""
    kv = gguf_io.read_gguf(gguf_path).kv
    k = "deepseek41.engram."
    return {"token_map": kv[k + "token_map"], "pad": kv[k + "pad_id"], "primes": kv[k + "primes"],
            "multipliers": kv[k + "multipliers"]}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sluice", default=os.path.join(HERE, "..", "..", "build", "sluice"))
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default=os.path.join(HERE, "config.json"))
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    corpus.build(a.out)
    with open(os.path.join(a.out, "train.txt"), encoding="utf-8") as f:
        train_text = f.read()
    with open(a.out + "/heldout.txt", encoding="utf-8") as f:
        heldout_text = f.read()
    cfg = json.load(open(a.config))
    v = bpe.train(train_text, cfg["vocab_size"])
    bpe.save(v, a.out)
    cfg["engram_token_map"], cfg["engram_compressed_vocab_size"] = tokmap.token_map(v.tokens, v.token_type)
    cfg_path = os.path.join(a.out, "model-config.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=1, sort_keys=True)
    init = os.path.join(a.out, "init.gguf")
    subprocess.run([a.sluice, "make-model", "--config", cfg_path, "--vocab", os.path.join(a.out, "vocab.gguf"),
                    "-o", init, "--seed", str(a.seed), "--force"], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(a.out, "hashing.json"), "w") as f:
        json.dump(hashing_of(init), f)
    for name, text in (("train", train_text), ("heldout", heldout_text)):
        ids = np.array(v.encode(text), dtype=np.uint16)
        ids.tofile(os.path.join(a.out, name + ".ids"))
        print("%s: %d tokens" % (name, len(ids)))


if __name__ == "__main__":
    main()
