"""A deepseek41 model in PyTorch, written from shared/spec/deepseek-v41.md sections 3-4 at any size.

One forward serves training and evaluation: a batch of whole sequences (B, T), every position at
once, with causal masks standing in for the engine's rings and caches. The engine's rounding
points and activation grids are applied straight-through (grids.py), so the model trains on what
sluice computes. Parameter names and shapes follow the GGUF tensors (export.py maps them).

What is not differentiable and how it trains (tools/train/README.md):
- the indexer's top-k and the candidate blocks are chosen under no_grad; the indexer's own weights
  learn from a KL loss towards the attention's distribution over the visible compressed rows
  (DeepSeek's lightning-indexer recipe), on inputs detached from the main graph;
- the router's selection bias (noaux_tc) is not a gradient parameter: after each step it moves by
  `bias_rate` towards balanced expert loads.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from grids import bf16, fp8_block32, fq, mxfp4_block32, nvfp4_block16, ste

NEG = float("-inf")


def latest_at_or_before(ids, layer):
    best = -1
    for x in ids:
        if x <= layer:
            best = max(best, x)
    return best


class Hash:
    """Engram hashing parameters as the GGUF holds them (spec 4.3)."""

    def __init__(self, token_map, pad, primes, multipliers, n_layers, orders, heads):
        self.token_map = torch.tensor(token_map, dtype=torch.int64)
        self.pad = int(pad)
        self.orders, self.heads = orders, heads
        self.primes = torch.tensor(primes, dtype=torch.int64).view(n_layers, orders * heads)
        self.mult = torch.tensor(multipliers, dtype=torch.int64).view(n_layers, orders + 1)
        off = torch.cumsum(self.primes, 1) - self.primes
        self.offsets = off

    def rows(self, tokens):
        """Row ids [B, T, n_engram_layers, orders*heads]; each sequence starts with a DEAD tail."""
        B, T = tokens.shape
        cur = self.token_map[tokens]
        ids = [cur]
        for j in range(1, self.orders + 1):
            shifted = torch.full_like(cur, -1)
            shifted[:, j:] = cur[:, :-j]
            ids.append(shifted)
        blocked = torch.zeros_like(cur, dtype=torch.bool)
        padded = []
        for x in ids:
            blocked = blocked | (x < 0)
            padded.append(torch.where(blocked, torch.full_like(x, self.pad), x))
        out = []
        for li in range(self.primes.shape[0]):
            h = padded[0] * self.mult[li, 0]
            cols = []
            for j in range(1, self.orders + 1):
                h = h ^ (padded[j] * self.mult[li, j])
                for hd in range(self.heads):
                    c = (j - 1) * self.heads + hd
                    cols.append(h % self.primes[li, c] + self.offsets[li, c])
            out.append(torch.stack(cols, -1))
        return torch.stack(out, 2)


def rope_freqs(cfg, ratio):
    r = cfg["qk_rope_head_dim"]
    theta = cfg["rope_theta"] if ratio == 0 else cfg["compress_rope_theta"]
    f = [theta ** (-2.0 * i / r) for i in range(r // 2)]
    if ratio > 0:
        ys = cfg["rope_scaling"]

        def cd(x):
            return r * math.log(ys["original_max_position_embeddings"] / (2 * math.pi * x)) / (2 * math.log(theta))

        low = max(math.floor(cd(ys["beta_fast"])), 0.0)
        high = min(math.ceil(cd(ys["beta_slow"])), r - 1)
        for i in range(len(f)):
            ramp = min(max((i - low) / max(high - low, 1e-3), 0.0), 1.0)
            f[i] = f[i] / ys["factor"] * ramp + f[i] * (1 - ramp)
    return f


def rope_table(freqs, positions):
    """cos, sin [len(positions), r/2] as the engine computes them: double angle, then float."""
    a = torch.tensor(positions, dtype=torch.float64)[:, None] * torch.tensor(freqs, dtype=torch.float64)[None]
    return torch.cos(a).float(), torch.sin(a).float()


def rope(v, cos, sin, inverse=False):
    """RoPE on the last 2*len(freqs) values of v[..., P, dim], interleaved pairs; BF16 output.
    cos/sin: [P, r/2], broadcast over the leading dims (heads go before P)."""
    r = cos.shape[-1] * 2
    head, tail = v[..., :-r], v[..., -r:]
    re, im = tail[..., 0::2], tail[..., 1::2]
    s = -sin if inverse else sin
    out = torch.stack((re * cos - im * s, re * s + im * cos), -1).flatten(-2)
    return torch.cat((head, bf16(out)), -1)


def rms(x, w, eps):
    return bf16(x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w)


def lin(x, w):
    return bf16(x @ w.t())


def sinkhorn(c, iters, eps):
    c = torch.softmax(c, -1) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


class HcMix(nn.Module):
    """Hyper-connection mixes (spec 3.2): pre, post and the Sinkhorn-balanced stream mix."""

    def __init__(self, cfg):
        super().__init__()
        n, D = cfg["hc_mult"], cfg["hidden_size"]
        self.n, self.eps, self.hc_eps, self.iters = n, cfg["rms_norm_eps"], cfg["hc_eps"], cfg["hc_sinkhorn_iters"]
        self.fn = nn.Parameter(torch.randn(2 * n + n * n, n * D) * (0.1 / math.sqrt(n * D)))
        base = torch.zeros(2 * n + n * n)
        base[2 * n:] = (torch.eye(n) * 4.0).flatten()  # starts near the identity mix
        self.base = nn.Parameter(base)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, X):  # X [B, T, n, D]
        n = self.n
        flat = X.flatten(-2)
        r = torch.rsqrt(flat.pow(2).mean(-1, keepdim=True) + self.eps)
        m = (flat @ self.fn.t()) * r
        pre = torch.sigmoid(m[..., :n] * self.scale[0] + self.base[:n]) + self.hc_eps
        post = 2 * torch.sigmoid(m[..., n:2 * n] * self.scale[1] + self.base[n:2 * n])
        c = (m[..., 2 * n:] * self.scale[2] + self.base[2 * n:]).unflatten(-1, (n, n))
        return pre, post, sinkhorn(c, self.iters, self.hc_eps)


def hc_pre(X, w):  # w [B, T, n]
    return bf16((w.unsqueeze(-1) * X).sum(-2))


def hc_post(Fo, X, post, C):  # C[i][j]: source i -> destination j
    Y = post.unsqueeze(-1) * Fo.unsqueeze(-2)
    for i in range(X.shape[-2]):
        Y = Y + C[..., i, :].unsqueeze(-1) * X[..., i, :].unsqueeze(-2)
    return bf16(Y)


def lin_param(out_dim, in_dim, scale=1.0):
    return nn.Parameter(torch.randn(out_dim, in_dim) * (scale / math.sqrt(in_dim)))


class Attention(nn.Module):
    def __init__(self, cfg, L, n_layer):
        super().__init__()
        D, H, hd = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"]
        qr, og, orank = cfg["q_lora_rank"], cfg["o_groups"], cfg["o_lora_rank"]
        self.L, self.cfg = L, cfg
        self.ratio = cfg["compress_ratios"][L]
        self.is_kv_source = L in cfg["kv_source_layer_ids"]
        self.is_index_source = L in cfg["index_source_layer_ids"]
        self.q_a = lin_param(qr, D)
        self.q_a_norm = nn.Parameter(torch.ones(qr))
        self.q_b = lin_param(H * hd, qr)
        self.kv = lin_param(hd, D)
        self.kv_norm = nn.Parameter(torch.ones(hd))
        self.o_a = lin_param(og * orank, H // og * hd)
        self.o_b = lin_param(D, og * orank, 1.0 / math.sqrt(2 * n_layer))
        self.sinks = nn.Parameter(torch.zeros(H))
        if self.is_kv_source:
            self.comp_kv = lin_param(hd, D)
            if self.ratio > 1:
                self.comp_gate = lin_param(hd, D)
            self.comp_norm = nn.Parameter(torch.ones(hd))
            self.idx_k = lin_param(cfg["index_head_dim"], hd)
            self.idx_k_norm = nn.Parameter(torch.ones(cfg["index_head_dim"]))
        if self.is_index_source:
            self.idx_q_b = lin_param(cfg["index_n_heads"] * cfg["index_head_dim"], qr)
            self.idx_proj = lin_param(cfg["index_n_heads"], D)

    # -- compressed KV and index keys of a KV-source layer (spec 3.4) --
    def compress(self, x, tabs):
        eps, ratio = self.cfg["rms_norm_eps"], self.ratio
        B, T, _ = x.shape
        G = T // ratio
        k = x[:, :G * ratio] @ self.comp_kv.t()
        if ratio > 1:
            s = x[:, :G * ratio] @ self.comp_gate.t()
            k, s = k.view(B, G, ratio, -1), s.view(B, G, ratio, -1)
            pooled = (torch.softmax(s, 2) * k).sum(2)
        else:
            pooled = k
        latent = rms(bf16(pooled), self.comp_norm, eps)
        cos, sin = tabs(self.L, [g * ratio for g in range(G)])
        ik = rms(lin(latent.detach(), self.idx_k), self.idx_k_norm, eps)
        ik = fq(mxfp4_block32, rope(ik, cos, sin))
        ckv = fq(nvfp4_block16, rope(latent, cos, sin))
        return ckv, ik

    # -- the lightning indexer of an index-source layer --
    def index_scores(self, x, qr, index_k, src_ratio, tabs):
        cfg = self.cfg
        B, T, _ = x.shape
        nh, ihd = cfg["index_n_heads"], cfg["index_head_dim"]
        cos, sin = tabs(self.L, list(range(T)))
        iq = lin(qr.detach(), self.idx_q_b).view(B, T, nh, ihd).transpose(1, 2)
        iq = rope(iq, cos, sin).transpose(1, 2)
        iq = fq(mxfp4_block32, iq.reshape(B, T, nh * ihd)).view(B, T, nh, ihd)
        w = lin(x.detach(), self.idx_proj) / math.sqrt(ihd * nh)
        dots = torch.relu(torch.einsum("bthd,bgd->bthg", iq, index_k))
        score = (dots * w.unsqueeze(-1)).sum(2)  # [B, T, G]
        G = index_k.shape[1]
        vis = visible(T, G, src_ratio, x.device).expand(B, T, G)
        return score.masked_fill(~vis, NEG), vis

    def forward(self, x, t_tabs, shared, aux):
        cfg, eps = self.cfg, self.cfg["rms_norm_eps"]
        B, T, _ = x.shape
        H, hd = cfg["num_attention_heads"], cfg["head_dim"]
        cos, sin = t_tabs(self.L, list(range(T)))
        qr = rms(lin(x, self.q_a), self.q_a_norm, eps)
        q = rope(lin(qr, self.q_b).view(B, T, H, hd).transpose(1, 2), cos, sin)  # [B, H, T, hd]
        kv = fq(fp8_block32, rope(rms(lin(x, self.kv), self.kv_norm, eps), cos, sin))  # [B, T, hd]
        if self.is_kv_source:
            shared["kv"][self.L] = self.compress(x, t_tabs)
        if self.is_index_source:
            self.select(x, qr, q, shared, aux, t_tabs)
        o = attend(q, kv, self.sinks, cfg, self.L, shared)
        o = rope(o, cos, sin, inverse=True).transpose(1, 2)  # [B, T, H, hd]
        og, orank = cfg["o_groups"], cfg["o_lora_rank"]
        o = o.reshape(B, T, og, H // og * hd)
        w = self.o_a.view(og, orank, -1)
        z = bf16(torch.einsum("btgi,goi->btgo", o, w)).reshape(B, T, og * orank)
        return lin(z, self.o_b)

    def select(self, x, qr, q, shared, aux, tabs):
        """Top-k compressed rows per query (no_grad choice) and the indexer's KL loss."""
        cfg = self.cfg
        src = latest_at_or_before(cfg["kv_source_layer_ids"], self.L)
        src_ratio = cfg["compress_ratios"][src]
        ckv, index_k = shared["kv"][src]
        score, vis = self.index_scores(x, qr, index_k, src_ratio, tabs)
        with torch.no_grad():
            allowed = vis
            if self.L == cfg["candidate_source_layer_id"]:
                shared["cand"] = candidate_mask(score, vis, cfg)
            elif self.L > cfg["candidate_source_layer_id"]:
                allowed = vis & shared["cand"]
            s = score.masked_fill(~allowed, NEG)
            k = min(cfg["index_topk"], s.shape[-1])
            sel = torch.zeros_like(allowed)
            if k > 0:
                top = torch.topk(s, k, dim=-1)
                sel.scatter_(-1, top.indices, top.values != NEG)
            shared["topk"] = sel
            # The attention's own distribution over the allowed rows, averaged over heads.
            logits = torch.einsum("bhtd,bgd->bhtg", q.detach(), ckv.detach()) / math.sqrt(cfg["head_dim"])
            logits = logits.masked_fill(~allowed.unsqueeze(1), NEG)
            target = torch.softmax(logits, -1).nan_to_num(0.0).mean(1)
        if self.training:
            logp = torch.log_softmax(score.masked_fill(~allowed, NEG), -1)
            has = allowed.any(-1)
            kl = (target * (torch.log(target.clamp_min(1e-12)) - logp.masked_fill(~allowed, 0.0))).sum(-1)
            aux["indexer"] = aux.get("indexer", 0.0) + (kl * has).sum() / has.sum().clamp_min(1)


def visible(T, G, ratio, device):
    """vis[t, g]: compressed row g is visible to the query at t (n_vis(t) = floor((t+1)/ratio))."""
    t = torch.arange(T, device=device)[:, None]
    g = torch.arange(G, device=device)[None]
    return (g < (t + 1) // ratio).unsqueeze(0)


def candidate_mask(score, vis, cfg):
    """The candidate pool of the candidate-source layer (spec 3.4 select_candidate_blocks)."""
    Bsz = cfg["candidate_block_size"]
    B, T, G = score.shape
    nb = (G + Bsz - 1) // Bsz
    pad = nb * Bsz - G
    s = F.pad(score, (0, pad), value=NEG).view(B, T, nb, Bsz).amax(-1)
    n_vis = vis.sum(-1)  # [B, T]
    newest = (n_vis - 1).clamp_min(0) // Bsz
    s = s.scatter(-1, newest.unsqueeze(-1), float("inf"))
    s = torch.where((n_vis > 0).unsqueeze(-1), s, torch.full_like(s, NEG))
    k = min(cfg["candidate_topk_blocks"], nb)
    top = torch.topk(s, k, dim=-1)
    keep = torch.zeros(B, T, nb, dtype=torch.bool, device=score.device)
    keep.scatter_(-1, top.indices, top.values != NEG)
    return keep.repeat_interleave(Bsz, -1)[..., :G] & vis


def attend(q, kv, sinks, cfg, L, shared):
    """Window rows plus the selected compressed rows, softmax with a sink (spec 3.4)."""
    B, H, T, hd = q.shape
    W = cfg["sliding_window"]
    t = torch.arange(T, device=q.device)
    win = (t[None] <= t[:, None]) & (t[None] > t[:, None] - W)  # [T, T]
    s_w = torch.einsum("bhtd,bpd->bhtp", q, kv).masked_fill(~win, NEG)
    rows, scores = [kv], [s_w]
    if cfg["compress_ratios"][L] > 0:
        src = latest_at_or_before(cfg["kv_source_layer_ids"], L)
        ckv = shared["kv"][src][0]
        sel = shared["topk"]  # [B, T, G]
        s_c = torch.einsum("bhtd,bgd->bhtg", q, ckv).masked_fill(~sel.unsqueeze(1), NEG)
        rows.append(ckv)
        scores.append(s_c)
    s = torch.cat(scores, -1) / math.sqrt(hd)
    m = s.amax(-1, keepdim=True).detach()  # the window always holds the query's own row
    e = torch.exp(s - m)
    den = e.sum(-1, keepdim=True) + torch.exp(sinks.view(1, H, 1, 1) - m)
    rows = torch.cat(rows, 1)  # [B, T+G, hd]
    return bf16(torch.einsum("bhtp,bpd->bhtd", bf16(e), rows) / den)


class Moe(nn.Module):
    def __init__(self, cfg, n_layer):
        super().__init__()
        D, E, ff = cfg["hidden_size"], cfg["n_routed_experts"], cfg["moe_intermediate_size"]
        self.cfg, self.E, self.k = cfg, E, cfg["num_experts_per_tok"]
        self.router = lin_param(E, D, 0.5)
        self.register_buffer("bias", torch.zeros(E))
        self.gate = nn.Parameter(torch.randn(E, ff, D) / math.sqrt(D))
        self.up = nn.Parameter(torch.randn(E, ff, D) / math.sqrt(D))
        self.down = nn.Parameter(torch.randn(E, D, ff) / math.sqrt(ff) / math.sqrt(2 * n_layer))
        self.gate_sh = lin_param(ff, D)
        self.up_sh = lin_param(ff, D)
        self.down_sh = lin_param(D, ff, 1.0 / math.sqrt(2 * n_layer))

    def swiglu(self, g, u, w=None):
        """SwiGLU of BF16 gate and up outputs: the clamps, then the routing weight, then BF16."""
        lim = self.cfg["swiglu_limit"]
        h = F.silu(torch.clamp(g, max=lim)) * torch.clamp(u, -lim, lim)
        return bf16(h if w is None else h * w)

    def routed(self, xf, sel, w):
        """The selected experts of every token, as one batched product per projection: the
        (token, slot) pairs sorted by expert and padded to the busiest expert's count."""
        N, k = sel.shape
        flat = sel.flatten()
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=self.E)
        cap = int(counts.max())
        starts = torch.cumsum(counts, 0) - counts
        rank = torch.arange(N * k) - starts[flat[order]]
        slot_of = torch.full((self.E * cap,), N * k, dtype=torch.long)
        slot_of[flat[order] * cap + rank] = order
        pair_tok = torch.cat((torch.arange(N).repeat_interleave(k), torch.tensor([0])))
        pair_w = torch.cat((w.flatten(), torch.zeros(1, dtype=w.dtype)))
        used = (slot_of < N * k).view(self.E, cap, 1)
        xe = xf[pair_tok[slot_of]].view(self.E, cap, -1) * used
        h = self.swiglu(bf16(torch.bmm(xe, self.gate.transpose(1, 2))), bf16(torch.bmm(xe, self.up.transpose(1, 2))),
                        pair_w[slot_of].view(self.E, cap, 1))
        y = bf16(torch.bmm(h, self.down.transpose(1, 2))) * used
        out = torch.zeros(N + 1, xf.shape[1])
        idx = torch.where(slot_of < N * k, pair_tok[slot_of], torch.full_like(slot_of, N))
        return out.index_add(0, idx, y.reshape(self.E * cap, -1))[:N]

    def forward(self, x, stats):
        B, T, D = x.shape
        xf = x.reshape(-1, D)
        logit = xf @ self.router.t()
        s = torch.sqrt(F.softplus(logit))
        with torch.no_grad():
            sel = torch.topk(s + self.bias, self.k, dim=-1).indices  # [N, k]
        ss = s.gather(-1, sel)
        w = ss / (ss.sum(-1, keepdim=True) + 1e-20) * self.cfg["routed_scaling_factor"]
        routed = self.routed(xf, sel, w)
        sh = lin(self.swiglu(lin(xf, self.gate_sh), lin(xf, self.up_sh)), self.down_sh)
        if stats is not None:
            stats.append(torch.bincount(sel.flatten(), minlength=self.E))
        return bf16(routed + sh).view(B, T, D)


class Engram(nn.Module):
    """Hashed n-gram rows added to the residual streams before a block (spec 4.5)."""

    def __init__(self, cfg, rows):
        super().__init__()
        D, n = cfg["hidden_size"], cfg["hc_mult"]
        cols = (cfg["engram_max_ngram_size"] - 1) * cfg["engram_n_heads"]
        hd = cfg["engram_head_dim"]
        self.cfg, self.n = cfg, n
        self.table = nn.Parameter(torch.randn(rows, hd) * 0.5)
        self.kv = lin_param((n + 1) * D, cols * hd)
        self.q_norm = nn.Parameter(torch.ones(n, D))
        self.k_norm = nn.Parameter(torch.ones(n, D))

    def forward(self, X, rows):  # X [B, T, n, D]; rows [B, T, cols]
        eps, D, n = self.cfg["rms_norm_eps"], self.cfg["hidden_size"], self.n
        E = fq(fp8_block32, self.table[rows]).flatten(-2)
        kvout = lin(E, self.kv)
        key = kvout[..., :n * D].unflatten(-1, (n, D))
        val = kvout[..., n * D:].unsqueeze(-2)
        wq = self.q_norm * self.k_norm
        dot = (X * wq * key).sum(-1)
        dot = dot * torch.rsqrt(X.pow(2).mean(-1) + eps) * torch.rsqrt(key.pow(2).mean(-1) + eps) / math.sqrt(D)
        gate = torch.sigmoid(torch.sign(dot) * torch.sqrt(torch.clamp(dot.abs(), min=1e-6)))
        return bf16(X + gate.unsqueeze(-1) * val)


class Block(nn.Module):
    def __init__(self, cfg, L, engram_rows):
        super().__init__()
        D, n_layer = cfg["hidden_size"], cfg["num_hidden_layers"]
        self.L, self.cfg = L, cfg
        self.hc_attn, self.hc_ffn = HcMix(cfg), HcMix(cfg)
        self.attn_norm = nn.Parameter(torch.ones(D))
        self.ffn_norm = nn.Parameter(torch.ones(D))
        self.attn = Attention(cfg, L, n_layer)
        self.moe = Moe(cfg, n_layer)
        self.engram = Engram(cfg, engram_rows) if engram_rows else None

    def forward(self, X, P, ctx):
        eps = self.cfg["rms_norm_eps"]
        if self.engram is not None:
            X = self.engram(X, ctx["engram_rows"][self.cfg["engram_layer_ids"].index(self.L)])
        a_pre, a_post, a_c = self.hc_attn(X)
        a_out = self.attn(rms(hc_pre(X, P), self.attn_norm, eps), ctx["tabs"], ctx["shared"], ctx["aux"])
        X1 = hc_post(a_out, X, a_post, a_c)
        f_pre, f_post, f_c = self.hc_ffn(X1)
        f_out = self.moe(rms(hc_pre(X1, a_pre), self.ffn_norm, eps), ctx["stats"])
        return hc_post(f_out, X1, f_post, f_c), f_pre


class Model(nn.Module):
    def __init__(self, cfg, hashing):
        super().__init__()
        D, V = cfg["hidden_size"], cfg["vocab_size"]
        self.cfg, self.hashing = cfg, hashing
        self.token_embd = nn.Parameter(torch.randn(V, D))
        rows = hashing.primes.sum(1).tolist() if hashing is not None else []
        eg = cfg.get("engram_layer_ids", [])
        self.blocks = nn.ModuleList(
            Block(cfg, L, rows[eg.index(L)] if L in eg else 0) for L in range(cfg["num_hidden_layers"]))
        self.output_norm = nn.Parameter(torch.ones(D))
        self.output = lin_param(V, D)
        self.freqs = [rope_freqs(cfg, cfg["compress_ratios"][L]) for L in range(cfg["num_hidden_layers"])]
        self._tab_cache = {}

    def tabs(self, L, positions):
        key = (L, positions[0] if positions else 0, len(positions), positions[1] - positions[0] if len(positions) > 1 else 1)
        if key not in self._tab_cache:
            self._tab_cache[key] = rope_table(self.freqs[L], positions)
        return self._tab_cache[key]

    def forward(self, tokens, stats=None, aux=None):
        """Logits [B, T, V] (f32) for tokens [B, T] that each start a sequence at position 0."""
        cfg = self.cfg
        B, T = tokens.shape
        n = cfg["hc_mult"]
        e = bf16(ste(self.token_embd, self.token_embd.half().float())[tokens])
        X = e.unsqueeze(2).expand(B, T, n, e.shape[-1])
        P = torch.zeros(B, T, n)
        P[..., 0] = 1
        ctx = {
            "tabs": self.tabs, "shared": {"kv": {}}, "aux": aux if aux is not None else {}, "stats": stats,
            "engram_rows": self.hashing.rows(tokens).unbind(2) if self.hashing is not None else None,
        }
        for blk in self.blocks:
            X, P = blk(X, P, ctx)
        h = rms(hc_pre(X, P), self.output_norm, cfg["rms_norm_eps"])
        return h @ self.output.t()

    @torch.no_grad()
    def balance(self, stats, rate):
        """noaux_tc: each layer's selection bias moves towards balanced loads."""
        for blk, load in zip(self.blocks, stats):
            load = load.float()
            blk.moe.bias += rate * torch.sign(load.mean() - load)
