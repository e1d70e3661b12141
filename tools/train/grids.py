"""The engine's numeric grids in torch, for training and for the trainer's eval forward.

Each function returns the value sluice computes (docs/numerics.md sections 3-5); the model
applies them straight-through (`ste`): the forward sees the grid, the gradient passes as if
the rounding were the identity.
"""
import torch


def ste(x, q):
    """Straight-through: the value of q, the gradient of x."""
    return x + (q - x).detach()


def round_bf16(x):
    return x.to(torch.bfloat16).to(torch.float32)


def bf16(x):
    """A BF16 rounding point of the forward (round to nearest even), straight-through."""
    return ste(x, round_bf16(x))


def _pow2_ceil(x):
    """2^ceil(log2(x)) for x > 0, exactly (as the reference's frexp rule)."""
    m, e = torch.frexp(x)
    return torch.where(m == 0.5, x, torch.ldexp(torch.ones_like(x), e))


def e4m3_round(v):
    """Nearest OCP E4M3FN value (ties to the even code), saturating at +-448."""
    a = v.abs()
    _, e = torch.frexp(a)
    step = torch.ldexp(torch.ones_like(a), torch.clamp(e - 1, min=-6) - 3)
    q = torch.clamp(torch.round(a / step) * step, max=448.0)
    return torch.copysign(q, v)


def e2m1_round(v):
    """Nearest of {0, .5, 1, 1.5, 2, 3, 4, 6} by magnitude, ties to the even code: the grid's
    step is 0.5 below 2, 1 below 4 and 2 above, and round-half-even on each step is the even code."""
    a = v.abs()
    q = torch.where(a < 2.0, torch.round(a * 2.0) * 0.5,
                    torch.where(a < 4.0, torch.round(a), torch.clamp(torch.round(a * 0.5) * 2.0, max=6.0)))
    return torch.copysign(q, v)


def _blocks(v, n):
    return v.reshape(*v.shape[:-1], v.shape[-1] // n, n)


@torch.no_grad()
def fp8_block32(v):
    """Raw window KV (and Engram rows): E4M3 in blocks of 32 with a power-of-two scale."""
    b = _blocks(v, 32)
    amax = b.abs().amax(-1, keepdim=True)
    s = _pow2_ceil(torch.clamp(amax, min=1e-4) / 448.0)
    q = e4m3_round(torch.clamp(b / s, -448.0, 448.0))
    return round_bf16(q * s).reshape(v.shape)


@torch.no_grad()
def nvfp4_block16(v):
    """Compressed KV rows: E2M1 in blocks of 16 with an E4M3 scale."""
    b = _blocks(v, 16)
    amax = b.abs().amax(-1, keepdim=True)
    s = e4m3_round(torch.clamp(amax, min=6.0 * 2.0 ** -9) / 6.0)
    return round_bf16(e2m1_round(b / s) * s).reshape(v.shape)


@torch.no_grad()
def mxfp4_block32(v):
    """Indexer queries and keys: E2M1 in blocks of 32 with a power-of-two scale."""
    b = _blocks(v, 32)
    amax = b.abs().amax(-1, keepdim=True)
    s = _pow2_ceil(torch.clamp(amax, min=6.0 * 2.0 ** -126) / 6.0)
    return round_bf16(e2m1_round(b / s) * s).reshape(v.shape)


def fq(fn, v):
    """A fake-quantization grid applied straight-through."""
    return ste(v, fn(v))
