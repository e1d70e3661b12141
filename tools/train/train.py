"""Trains the deepseek41 model of WORK/model-config.json on WORK/train.ids (prepare.py made both).

    /usr/bin/python3 tools/train/train.py --work WORK --steps 900

Seeded and reproducible on one machine and thread count: the batches are drawn from a seeded
generator, the model is initialised from the seed, and torch runs deterministic algorithms.
Each sequence starts with BOS at position 0 followed by T-1 tokens from a random offset, as the
engine sees a prompt (and as `sluice perplexity` scores a chunk). Writes WORK/model.pt and
WORK/train-log.json (loss per step, held-out loss every --eval-every steps).
"""
import os

# Debian's torch does not know its BLAS is OpenBLAS (BLAS_INFO=generic), so it never sets
# OpenBLAS's thread count: OpenBLAS would run its own spinning threads beside torch's and, with
# anything else on the machine, make each product many times slower. torch's threads do the work.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse  # noqa: E402
import json
import math
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from model import Hash, Model  # noqa: E402


def load_model(work, seed=0):
    cfg = json.load(open(os.path.join(work, "model-config.json")))
    hs = json.load(open(os.path.join(work, "hashing.json")))
    orders, heads = cfg["engram_max_ngram_size"] - 1, cfg["engram_n_heads"]
    h = Hash(hs["token_map"], hs["pad"], hs["primes"], hs["multipliers"], len(cfg["engram_layer_ids"]), orders, heads)
    torch.manual_seed(seed)
    return cfg, Model(cfg, h)


def batch(ids, B, T, gen, bos):
    starts = torch.randint(0, len(ids) - T, (B,), generator=gen)
    x = torch.stack([torch.from_numpy(ids[s:s + T].astype(np.int64)) for s in starts.tolist()])
    x[:, 0] = bos
    return x


def lr_at(step, steps, peak, warmup):
    if step < warmup:
        return peak * (step + 1) / warmup
    p = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * p)))


@torch.no_grad()
def heldout_loss(model, ids, T, n, bos):
    """Mean next-token loss on n fixed, evenly spaced held-out windows."""
    model.eval()
    total, count = 0.0, 0
    for s in np.linspace(0, len(ids) - T - 1, n).astype(int):
        x = torch.from_numpy(ids[s:s + T].astype(np.int64))[None]
        x[0, 0] = bos
        y = torch.from_numpy(ids[s + 1:s + T + 1].astype(np.int64))[None]
        logits = model(x)
        total += F.cross_entropy(logits[0, T // 2:], y[0, T // 2:], reduction="sum").item()
        count += T - T // 2
    model.train()
    return total / count


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--steps", type=int, default=900)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--warmup", type=int, default=50)
    ap.add_argument("--indexer-weight", type=float, default=0.1)
    ap.add_argument("--bias-rate", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    torch.use_deterministic_algorithms(True)
    cfg, model = load_model(a.work, a.seed)
    bos = cfg["bos_token_id"]
    train_ids = np.fromfile(os.path.join(a.work, "train.ids"), dtype=np.uint16)
    held_ids = np.fromfile(os.path.join(a.work, "heldout.ids"), dtype=np.uint16)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "table" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "table" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(a.seed)
    log = {"args": vars(a), "params": sum(p.numel() for p in model.parameters()), "steps": [], "heldout": []}
    t0 = time.time()
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a.steps, a.lr, a.warmup)
        x = batch(train_ids, a.batch, a.seq + 1, gen, bos)
        stats, aux = [], {}
        logits = model(x[:, :-1], stats, aux)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1))
        total = loss + a.indexer_weight * aux.get("indexer", 0.0)
        opt.zero_grad(set_to_none=True)
        total.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.balance(stats, a.bias_rate)
        load = torch.stack(stats).float()
        imbalance = (load.max(1).values / load.mean(1)).mean().item()
        log["steps"].append({"step": step, "loss": loss.item(), "indexer_kl": float(aux.get("indexer", 0.0)),
                             "max_over_mean_load": imbalance, "seconds": time.time() - t0})
        if step % 10 == 0:
            print("step %d loss %.4f indexer %.4f load %.2f  %.0f s" % (
                step, loss.item(), float(aux.get("indexer", 0.0)), imbalance, time.time() - t0), flush=True)
        if (step + 1) % a.eval_every == 0 or step + 1 == a.steps:
            hl = heldout_loss(model, held_ids, a.seq, 16, bos)
            log["heldout"].append({"step": step + 1, "loss": hl})
            print("  held-out loss %.4f (ppl %.2f)" % (hl, math.exp(hl)), flush=True)
            torch.save(model.state_dict(), os.path.join(a.work, "model.pt"))
            with open(os.path.join(a.work, "train-log.json"), "w") as f:
                json.dump(log, f)


if __name__ == "__main__":
    main()
