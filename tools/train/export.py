"""Writes the trained weights into the GGUF that `sluice make-model` made (prepare.py), then reads
them back, so that every figure the trainer states is computed on exactly the shipped weights.

    /usr/bin/python3 tools/train/export.py --work WORK --out models/NAME.gguf --ref models/NAME.ref.json

The reference file holds, for a few held-out sequences, what the trainer's eval forward gives at
every position (the next token's log-probability, the argmax and its margin over the second
choice) and its held-out perplexity by llama-perplexity's method: what the engine's cross-check
test and `sluice perplexity` are held to.
"""
import os

# Debian's torch does not know its BLAS is OpenBLAS (BLAS_INFO=generic), so it never sets
# OpenBLAS's thread count: OpenBLAS would run its own spinning threads beside torch's and, with
# anything else on the machine, make each product many times slower. torch's threads do the work.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json
import math
import shutil
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gguf_io  # noqa: E402
from train import load_model  # noqa: E402


def tensor_map(model):
    """GGUF tensor name -> the torch tensor holding its values (torch [out, in] = GGUF [in, out])."""
    m = {"token_embd.weight": model.token_embd, "output_norm.weight": model.output_norm,
         "output.weight": model.output}
    for L, b in enumerate(model.blocks):
        p = "blk.%d." % L
        for s, mix in (("attn", b.hc_attn), ("ffn", b.hc_ffn)):
            m[p + "hc_%s_fn.weight" % s] = mix.fn
            m[p + "hc_%s_base.weight" % s] = mix.base
            m[p + "hc_%s_scale.weight" % s] = mix.scale
        a, f = b.attn, b.moe
        m.update({p + "attn_norm.weight": b.attn_norm, p + "ffn_norm.weight": b.ffn_norm,
                  p + "attn_sinks.weight": a.sinks, p + "attn_q_a.weight": a.q_a,
                  p + "attn_q_a_norm.weight": a.q_a_norm, p + "attn_q_b.weight": a.q_b,
                  p + "attn_kv.weight": a.kv, p + "attn_kv_a_norm.weight": a.kv_norm,
                  p + "attn_output_a.weight": a.o_a, p + "attn_output_b.weight": a.o_b,
                  p + "ffn_gate_inp.weight": f.router, p + "exp_probs_b.bias": f.bias,
                  p + "exp_probs_b_vl.bias": f.bias,  # no image positions: the text bias serves
                  p + "ffn_gate_shexp.weight": f.gate_sh, p + "ffn_up_shexp.weight": f.up_sh,
                  p + "ffn_down_shexp.weight": f.down_sh, p + "ffn_gate_exps.weight": f.gate,
                  p + "ffn_up_exps.weight": f.up, p + "ffn_down_exps.weight": f.down})
        if a.is_kv_source:
            m[p + "attn_compressor_kv.weight"] = a.comp_kv
            if a.ratio > 1:
                m[p + "attn_compressor_gate.weight"] = a.comp_gate
            m[p + "attn_compressor_norm.weight"] = a.comp_norm
            m[p + "indexer.attn_k.weight"] = a.idx_k
            m[p + "indexer.k_norm.weight"] = a.idx_k_norm
        if a.is_index_source:
            m[p + "indexer.attn_q_b.weight"] = a.idx_q_b
            m[p + "indexer.proj.weight"] = a.idx_proj
        if b.engram is not None:
            m[p + "engram_embd.weight"] = b.engram.table
            m[p + "engram_q_norm.weight"] = b.engram.q_norm
            m[p + "engram_k_norm.weight"] = b.engram.k_norm
            m[p + "engram_kv.weight"] = b.engram.kv
    return m


def export(model, path):
    g = gguf_io.read_gguf(path)
    hd = model.cfg["engram_head_dim"]
    tm = tensor_map(model)
    names = {t.name for t in g.tensors}
    if names != set(tm):
        raise SystemExit("tensor sets differ: file only %s, model only %s" % (sorted(names - set(tm)), sorted(set(tm) - names)))
    for t in g.tensors:
        v = tm[t.name].detach().float().contiguous().numpy().reshape(-1)
        if t.name.endswith("engram_embd.weight"):
            payload = gguf_io.encode_engram_rows(v, hd)
        else:
            payload = gguf_io.encode_tensor(t.type_name, v)
        gguf_io.patch_tensor(path, t.name, payload)


@torch.no_grad()
def load_back(model, path):
    """The model's parameters replaced by the file's values, as the engine dequantizes them."""
    g = gguf_io.read_gguf(path)
    hd = model.cfg["engram_head_dim"]
    for name, p in tensor_map(model).items():
        t = g.tensor(name)
        raw = g.read_tensor_bytes(name)
        if name.endswith("engram_embd.weight"):
            v = gguf_io.decode_engram_rows(raw, hd)
        else:
            v = gguf_io.decode_tensor(t.type_name, raw)
        p.copy_(torch.tensor(np.asarray(v, dtype=np.float32)).view(p.shape))


@torch.no_grad()
def perplexity(model, ids, n_ctx, bos, chunks=None):
    """llama-perplexity as `sluice perplexity` does it (docs/perplexity.md): the file's tokens with
    BOS first, disjoint windows of n_ctx, each window's first token replaced by BOS, the
    predictions at positions n_ctx/2 .. n_ctx-2 scored."""
    ids = np.concatenate([np.array([bos], dtype=ids.dtype), ids])
    nll, n = [], len(ids) // n_ctx
    n = n if chunks is None else min(n, chunks)
    for c in range(n):
        x = torch.from_numpy(ids[c * n_ctx:(c + 1) * n_ctx].astype(np.int64))[None]
        target = x[0, 1:].clone()
        x[0, 0] = bos
        lp = F.log_softmax(model(x)[0].double(), -1)
        first = n_ctx // 2
        nll.append(-lp[first:n_ctx - 1].gather(-1, target[first:, None])[:, 0])
    nll = torch.cat(nll)
    mean = nll.mean().item()
    err = math.exp(mean) * math.sqrt(nll.var().item() / (len(nll) - 1))
    return {"ppl": math.exp(mean), "stderr": err, "nll_mean": mean, "tokens_scored": len(nll), "chunks": n,
            "n_ctx": n_ctx}


@torch.no_grad()
def reference(model, ids, n_seq, length, bos):
    out = []
    for s in np.linspace(0, len(ids) - length - 1, n_seq).astype(int):
        x = torch.from_numpy(ids[s:s + length].astype(np.int64))[None]
        x[0, 0] = bos
        nxt = torch.from_numpy(ids[s + 1:s + length + 1].astype(np.int64))
        lp = F.log_softmax(model(x)[0].double(), -1)
        top2 = lp.topk(2, -1)
        out.append({"tokens": x[0].tolist(), "next": nxt.tolist(),
                    "logprob": lp.gather(-1, nxt[:, None])[:, 0].tolist(),
                    "argmax": top2.indices[:, 0].tolist(),
                    "margin": (top2.values[:, 0] - top2.values[:, 1]).tolist()})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--ref", required=True)
    ap.add_argument("--n-ctx", type=int, default=256)
    ap.add_argument("--ref-seqs", type=int, default=4)
    ap.add_argument("--ref-len", type=int, default=256)
    ap.add_argument("--head-chunks", type=int, default=8)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    cfg, model = load_model(a.work)
    model.load_state_dict(torch.load(os.path.join(a.work, "model.pt")))
    model.eval()
    tmp = a.out + ".tmp"
    shutil.copyfile(os.path.join(a.work, "init.gguf"), tmp)
    export(model, tmp)
    load_back(model, tmp)
    held = np.fromfile(os.path.join(a.work, "heldout.ids"), dtype=np.uint16)
    bos = cfg["bos_token_id"]
    ref = {"perplexity": perplexity(model, held, a.n_ctx, bos),
           "perplexity_head": perplexity(model, held, a.n_ctx, bos, a.head_chunks),
           "sequences": reference(model, held, a.ref_seqs, a.ref_len, bos)}
    os.replace(tmp, a.out)
    stem = os.path.splitext(a.out)[0]
    for src, dst in (("heldout.txt", ".heldout.txt"), ("model-config.json", ".config.json"),
                     ("train-log.json", ".train-log.json")):
        shutil.copyfile(os.path.join(a.work, src), stem + dst)
    with open(a.ref, "w") as f:
        json.dump(ref, f)
    print(json.dumps(ref["perplexity"]))


if __name__ == "__main__":
    main()
