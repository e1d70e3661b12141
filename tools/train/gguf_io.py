#!/usr/bin/python3
"""Minimal GGUF v3 I/O and tensor payload codecs for the trained deepseek41 model (issue 52).

Standard library only; numpy is used when importable (faster encoders) but never required.

  write_gguf(path, kvs, tensors=(), alignment=32)   metadata (+ optional tensors) writer
  write_vocab_gguf(path, tokens, token_type, merges) the keys sluice's add_tokenizer_metadata writes
  read_gguf(path) -> GGUF                            metadata + tensor directory
  patch_tensor(path, name, payload)                  overwrite one tensor's bytes in place

  encode_f32/f16/bf16/q8_0(values) -> bytes          payload of a tensor (row-major, ne0 fastest)
  encode_engram_rows(values, head_dim) -> bytes      ENGRAM_ROW rows (stored in GGUF as I8)
  decode_*(payload[, n]) -> list of float            the inverse, bit-exact with sluice's dequant

`values` may be a numpy array (any float dtype; it is first rounded to float32, as a torch
.numpy() export would be), an array('f'), or any sequence of Python floats (each rounded to
float32 first).

Numerics (must match sluice bit for bit, src/kernels/fp.h and iquant_types.cpp):
  F16  f32 -> f16 round to nearest even, overflow -> Inf, NaN -> 0x7e00 | sign.
  BF16 f32 -> bf16 round to nearest even, NaN -> (x >> 16) | 0x40.
  Q8_0 ggml's REFERENCE rule (quantize_row_q8_0_ref): per 32 values, amax = max |x|,
       d = f32(amax / 127), id = d ? f32(1 / d) : 0, q = roundf(f32(x * id)) (ties away from
       zero), clamped to [-127, 127]; block = fp16(d) (little-endian) + 32 int8 codes.
  ENGRAM_ROW (spec 4.4, sluice kernels/engram_row.h): a row of D values (D % 32 == 0) is D E4M3
       (OCP e4m3fn) codes followed by D/32 E8M0 bytes; scale byte k covers values 32k..32k+31.
       Encoder (the spec's FP8 rule): amax = max(max |x| over the 32 values, 1e-4);
       scale = 2^ceil(log2(amax / 448)) computed exactly (smallest power of two p with
       amax <= 448 p), E8M0 byte = log2(p) + 127 clamped to [0, 254]; code = e4m3(x / p) with
       round to nearest even, saturating at +-448 (never 0x7f / 0xff). NaN input is rejected.
       Decoder: round_bf16(f32(e4m3(code) * 2^(byte - 127))).
"""
import array
import math
import os
import struct
import sys

try:
    import numpy as np  # optional
except Exception:  # pragma: no cover
    np = None

assert sys.byteorder == "little", "gguf_io assumes a little-endian host"

# ---- GGUF constants ------------------------------------------------------------------------

MAGIC = 0x46554747  # b"GGUF"
VERSION = 3

# Metadata value types.
U8, I8, U16, I16, U32, I32, F32V, BOOL, STRING, ARRAY, U64, I64, F64V = range(13)
_SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32V: "<f",
               BOOL: "<?", U64: "<Q", I64: "<q", F64V: "<d"}
_ARRAY_CODE = {U8: "B", I8: "b", U16: "H", I16: "h", U32: "I", I32: "i", F32V: "f", U64: "Q",
               I64: "q", F64V: "d", BOOL: "B"}

# Tensor types: id -> (name, block elements, block bytes), as src/format/tensor_type.cpp.
TENSOR_TYPES = {
    0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18), 3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22), 7: ("Q5_1", 32, 24), 8: ("Q8_0", 32, 34), 9: ("Q8_1", 32, 36),
    10: ("Q2_K", 256, 84), 11: ("Q3_K", 256, 110), 12: ("Q4_K", 256, 144), 13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210), 15: ("Q8_K", 256, 292), 16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74), 18: ("IQ3_XXS", 256, 98), 19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18), 21: ("IQ3_S", 256, 110), 22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136), 24: ("I8", 1, 1), 25: ("I16", 1, 2), 26: ("I32", 1, 4),
    27: ("I64", 1, 8), 28: ("F64", 1, 8), 29: ("IQ1_M", 256, 56), 30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54), 35: ("TQ2_0", 256, 66), 39: ("MXFP4", 32, 17), 40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18), 42: ("Q2_0", 64, 18),
}
TYPE_ID = {v[0]: k for k, v in TENSOR_TYPES.items()}
T_F32, T_F16, T_Q8_0, T_I8, T_BF16 = 0, 1, 8, 24, 30


def align_up(x, a):
    return (x + a - 1) // a * a


def tensor_nbytes(type_id, ne):
    name, be, bb = TENSOR_TYPES[type_id]
    if ne[0] % be:
        raise ValueError("ne[0] = %d is not a multiple of the %s block size %d" % (ne[0], name, be))
    n = ne[0] // be * bb
    for d in ne[1:]:
        n *= d
    return n


# ---- writer --------------------------------------------------------------------------------

def _put_string(out, s):
    b = s.encode("utf-8") if isinstance(s, str) else bytes(s)
    out += struct.pack("<Q", len(b))
    out += b


def _put_value(out, vtype, value):
    if vtype == STRING:
        _put_string(out, value)
    elif vtype == ARRAY:
        etype, items = value
        out += struct.pack("<IQ", etype, len(items))
        if etype == STRING:
            for s in items:
                _put_string(out, s)
        elif etype in _ARRAY_CODE:
            out += array.array(_ARRAY_CODE[etype], [int(bool(x)) if etype == BOOL else x
                                                    for x in items]).tobytes()
        else:
            raise ValueError("unsupported array element type %d" % etype)
    else:
        out += struct.pack(_SCALAR_FMT[vtype], value)


def write_gguf(path, kvs, tensors=(), alignment=32):
    """kvs: list of (key, vtype, value); for ARRAY the value is (elem_type, list).
    tensors: list of (name, ne list (ne0 first), type_id, payload bytes). Tensor data is
    aligned (and the file padded) to `alignment`; general.alignment is added when it is not 32.
    """
    kvs = list(kvs)
    keys = [k for k, _, _ in kvs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate metadata key")
    if alignment != 32 and "general.alignment" not in keys:
        kvs.insert(0, ("general.alignment", U32, alignment))
    out = bytearray()
    out += struct.pack("<IIQQ", MAGIC, VERSION, len(tensors), len(kvs))
    for key, vtype, value in kvs:
        _put_string(out, key)
        out += struct.pack("<I", vtype)
        _put_value(out, vtype, value)
    offset = 0
    layout = []
    for name, ne, type_id, payload in tensors:
        nb = tensor_nbytes(type_id, ne)
        if len(payload) != nb:
            raise ValueError("tensor %s: payload of %d bytes, expected %d" % (name, len(payload), nb))
        offset = align_up(offset, alignment)
        _put_string(out, name)
        out += struct.pack("<I", len(ne))
        out += struct.pack("<%dQ" % len(ne), *ne)
        out += struct.pack("<IQ", type_id, offset)
        layout.append((offset, payload))
        offset += nb
    data_start = align_up(len(out), alignment)
    out += bytes(data_start - len(out))
    for off, payload in layout:
        out += bytes(data_start + off - len(out))
        out += payload
    out += bytes(align_up(len(out), alignment) - len(out))
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(out)
    os.replace(tmp, path)


def write_vocab_gguf(path, tokens, token_type, merges, bos=0, eos=1, name=None):
    """A metadata-only vocabulary GGUF with exactly the keys of vocab.cpp add_tokenizer_metadata
    (plus general.name when given); `sluice make-model --vocab PATH` and `sluice tokenize -m PATH`
    read it."""
    if len(tokens) != len(token_type):
        raise ValueError("tokens and token_type differ in length")
    kvs = []
    if name:
        kvs.append(("general.name", STRING, name))
    kvs += [
        ("tokenizer.ggml.model", STRING, "gpt2"),
        ("tokenizer.ggml.pre", STRING, "joyai-llm"),
        ("tokenizer.ggml.tokens", ARRAY, (STRING, list(tokens))),
        ("tokenizer.ggml.token_type", ARRAY, (I32, [int(t) for t in token_type])),
        ("tokenizer.ggml.merges", ARRAY, (STRING, list(merges))),
        ("tokenizer.ggml.bos_token_id", U32, bos),
        ("tokenizer.ggml.eos_token_id", U32, eos),
        ("tokenizer.ggml.add_bos_token", BOOL, True),
        ("tokenizer.ggml.add_eos_token", BOOL, False),
    ]
    write_gguf(path, kvs)


# ---- reader --------------------------------------------------------------------------------

class Tensor:
    __slots__ = ("name", "ne", "type", "type_name", "rel_offset", "offset", "nbytes")

    def __repr__(self):
        return "Tensor(%s, ne=%s, %s, offset=%d, nbytes=%d)" % (
            self.name, self.ne, self.type_name, self.offset, self.nbytes)


class GGUF:
    """version, kv (dict key -> value; arrays as lists), kv_types (key -> vtype or
    (ARRAY, elem)), alignment, data_offset, file_size, tensors (list, file order),
    tensor(name)."""

    def tensor(self, name):
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError("%s has no tensor named %s" % (self.path, name))

    def read_tensor_bytes(self, name):
        t = self.tensor(name)
        with open(self.path, "rb") as f:
            f.seek(t.offset)
            b = f.read(t.nbytes)
        if len(b) != t.nbytes:
            raise ValueError("tensor %s runs past the end of %s" % (name, self.path))
        return b


class _Cur:
    def __init__(self, f):
        self.f = f
        self.pos = 0

    def read(self, n):
        b = self.f.read(n)
        if len(b) != n:
            raise ValueError("truncated GGUF at byte %d" % self.pos)
        self.pos += n
        return b

    def get(self, fmt):
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def string(self):
        return self.read(self.get("<Q")).decode("utf-8", errors="surrogateescape")


def _read_value(c, vtype):
    if vtype == STRING:
        return c.string()
    if vtype == ARRAY:
        etype = c.get("<I")
        n = c.get("<Q")
        if etype == STRING:
            return [c.string() for _ in range(n)]
        if etype == ARRAY:
            raise ValueError("nested arrays are not supported")
        code = _ARRAY_CODE[etype]
        a = array.array(code)
        a.frombytes(c.read(n * a.itemsize))
        return [bool(x) for x in a] if etype == BOOL else a.tolist()
    return c.get(_SCALAR_FMT[vtype])


def read_gguf(path):
    g = GGUF()
    g.path = path
    g.file_size = os.path.getsize(path)
    with open(path, "rb") as f:
        c = _Cur(f)
        if c.get("<I") != MAGIC:
            raise ValueError(path + ": not a GGUF file")
        g.version = c.get("<I")
        if g.version not in (2, 3):
            raise ValueError("%s: unsupported GGUF version %d" % (path, g.version))
        n_tensors = c.get("<Q")
        n_kv = c.get("<Q")
        g.kv, g.kv_types = {}, {}
        g.alignment = 32
        for _ in range(n_kv):
            key = c.string()
            vtype = c.get("<I")
            if vtype == ARRAY:
                here = f.tell()
                etype = struct.unpack("<I", f.read(4))[0]
                f.seek(here)
                g.kv_types[key] = (ARRAY, etype)
            else:
                g.kv_types[key] = vtype
            g.kv[key] = _read_value(c, vtype)
            if key == "general.alignment":
                if vtype != U32 or g.kv[key] <= 0 or g.kv[key] & (g.kv[key] - 1):
                    raise ValueError(path + ": bad general.alignment")
                g.alignment = g.kv[key]
        g.tensors = []
        for _ in range(n_tensors):
            t = Tensor()
            t.name = c.string()
            nd = c.get("<I")
            t.ne = list(struct.unpack("<%dQ" % nd, c.read(8 * nd)))
            t.type = c.get("<I")
            t.type_name = TENSOR_TYPES[t.type][0]
            t.rel_offset = c.get("<Q")
            t.nbytes = tensor_nbytes(t.type, t.ne)
            g.tensors.append(t)
        g.data_offset = align_up(c.pos, g.alignment)
    for t in g.tensors:
        if t.rel_offset % g.alignment:
            raise ValueError("%s: tensor %s offset is not aligned" % (path, t.name))
        t.offset = g.data_offset + t.rel_offset
        if t.offset + t.nbytes > g.file_size:
            raise ValueError("%s: tensor %s runs past the end of the file" % (path, t.name))
    return g


def patch_tensor(path, name, payload):
    """Overwrites the payload of tensor `name` in place (the byte size must match exactly)."""
    t = read_gguf(path).tensor(name)
    payload = bytes(payload)
    if len(payload) != t.nbytes:
        raise ValueError("tensor %s (%s, ne=%s) takes %d bytes, got %d" % (
            name, t.type_name, t.ne, t.nbytes, len(payload)))
    with open(path, "r+b") as f:
        f.seek(t.offset)
        f.write(payload)


# ---- float helpers -------------------------------------------------------------------------

def _is_numpy(x):
    return np is not None and isinstance(x, np.ndarray)


def to_f32_array(values):
    """values -> array('f') (each value rounded to float32 once)."""
    if isinstance(values, array.array) and values.typecode == "f":
        return values
    if _is_numpy(values):
        a = array.array("f")
        a.frombytes(np.ascontiguousarray(values, dtype="<f4").tobytes())
        return a
    return array.array("f", values)


def _f32_bits(a):
    """array('f') -> array('I') of the same bits."""
    b = array.array("I")
    b.frombytes(a.tobytes())
    return b


def f32_round(x):
    """A Python float rounded to the nearest float32 (ties to even)."""
    return array.array("f", (x,))[0]


def f32_to_f16_bits(x):
    """sluice's f32_to_f16 on the bits of a float32 (int). Scalar reference."""
    sign = (x >> 16) & 0x8000
    ax = x & 0x7FFFFFFF
    if ax > 0x7F800000:
        return sign | 0x7E00
    if ax >= 0x477FF000:
        return sign | 0x7C00
    if ax < 0x38800000:
        r = f32_round(struct.unpack("<f", struct.pack("<I", ax))[0] + 0.5)
        return sign | (struct.unpack("<I", struct.pack("<f", r))[0] - 0x3F000000)
    lsb = (ax >> 13) & 1
    return sign | (((ax + 0xC8000FFF + lsb) & 0xFFFFFFFF) >> 13)


def f32_to_bf16_bits(x):
    if (x & 0x7FFFFFFF) > 0x7F800000:
        return (x >> 16) | 0x0040
    return ((x + 0x7FFF + ((x >> 16) & 1)) & 0xFFFFFFFF) >> 16


def f16_bits_to_float(h):
    return struct.unpack("<e", struct.pack("<H", h))[0]


def e4m3_to_float(c):
    sign = -1.0 if c & 0x80 else 1.0
    e = (c >> 3) & 0xF
    m = c & 7
    if e == 15 and m == 7:
        return math.nan
    if e == 0:
        return sign * math.ldexp(m, -9)
    return sign * math.ldexp(1.0 + m / 8.0, e - 7)


def f32_to_e4m3(f):
    """sluice's f32_to_e4m3 (RNE, saturating at +-448, NaN -> 0x7f|sign) for a float32 value."""
    x = struct.unpack("<I", struct.pack("<f", f))[0]
    sign = (x >> 24) & 0x80
    ax = x & 0x7FFFFFFF
    if ax > 0x7F800000:
        return sign | 0x7F
    if ax >= 0x43E00000:
        return sign | 0x7E
    if ax < 0x3C800000:
        r = f32_round(struct.unpack("<f", struct.pack("<I", ax))[0] + 16384.0)
        return sign | (struct.unpack("<I", struct.pack("<f", r))[0] - 0x46800000)
    lsb = (ax >> 20) & 1
    code = ((ax + 0x7FFFF + lsb) >> 20) - (120 << 3)
    return sign | min(code, 0x7E)


_E4M3_TABLE = [e4m3_to_float(c) for c in range(256)]


def e8m0_to_float(e):
    if e == 0xFF:
        return math.nan
    if e == 0:
        return math.ldexp(1.0, -127)
    return math.ldexp(1.0, e - 127)


def round_bf16(v):
    """float -> f32 -> bf16 (RNE) -> float."""
    b = f32_to_bf16_bits(_f32_bits(array.array("f", (v,)))[0])
    return struct.unpack("<f", struct.pack("<I", b << 16))[0]


# ---- encoders ------------------------------------------------------------------------------

def encode_f32(values):
    return to_f32_array(values).tobytes()


def encode_f16(values):
    if _is_numpy(values):
        # numpy's float32 -> float16 cast is IEEE RNE with overflow to Inf, like sluice; NaN
        # payloads may differ, so NaNs are set to sluice's 0x7e00 | sign explicitly.
        x = np.ascontiguousarray(values, dtype="<f4")
        with np.errstate(over="ignore"):
            h = x.astype("<f2").view("<u2").copy()
        nan = np.isnan(x)
        if nan.any():
            h[nan] = (np.signbit(x[nan]).astype("<u2") << 15) | 0x7E00
        return h.tobytes()
    bits = _f32_bits(to_f32_array(values))
    return array.array("H", (f32_to_f16_bits(x) for x in bits)).tobytes()


def encode_bf16(values):
    if _is_numpy(values):
        x = np.ascontiguousarray(values, dtype="<f4").view("<u4").astype(np.uint64)
        r = ((x + 0x7FFF + ((x >> 16) & 1)) >> 16) & 0xFFFF
        nan = (x & 0x7FFFFFFF) > 0x7F800000
        r = np.where(nan, (x >> 16) | 0x40, r)
        return r.astype("<u2").tobytes()
    bits = _f32_bits(to_f32_array(values))
    return array.array("H", (f32_to_bf16_bits(x) for x in bits)).tobytes()


def _q8_0_block(xs, out):
    amax = 0.0
    for v in xs:
        a = abs(v)
        if amax < a:  # std::max(amax, |x|): a NaN never replaces amax
            amax = a
    d = f32_round(amax / 127.0)
    idv = f32_round(1.0 / d) if d != 0.0 else 0.0
    out += struct.pack("<H", f32_to_f16_bits(_f32_bits(array.array("f", (d,)))[0]))
    codes = []
    for p in array.array("f", [v * idv for v in xs]):  # f32(x * id)
        if p != p:
            q = 0
        else:
            q = math.floor(abs(p) + 0.5) if abs(p) < 1e30 else 127
            q = min(q, 127)
            if p < 0:
                q = -q
        codes.append(q)
    out += array.array("b", codes).tobytes()


def encode_q8_0(values):
    """Q8_0 payload; len(values) must be a multiple of 32 (rows of ne0 % 32 == 0 laid end to end)."""
    if _is_numpy(values):
        x = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
        if x.size % 32:
            raise ValueError("Q8_0 needs a multiple of 32 values, got %d" % x.size)
        x = x.reshape(-1, 32)
        if not np.isfinite(x).all():
            raise ValueError("Q8_0 encoder (numpy path) needs finite values")
        amax = np.abs(x).max(axis=1)
        d = (amax / np.float32(127.0)).astype("<f4")
        with np.errstate(divide="ignore"):
            idv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype("<f4")
        p = (x * idv[:, None]).astype("<f4").astype(np.float64)
        q = np.minimum(np.floor(np.abs(p) + 0.5), 127.0) * np.sign(p)
        blocks = np.empty((x.shape[0], 34), dtype=np.uint8)
        blocks[:, :2] = np.frombuffer(encode_f16(d), dtype=np.uint8).reshape(-1, 2)
        blocks[:, 2:] = q.astype(np.int8).view(np.uint8)
        return blocks.tobytes()
    a = to_f32_array(values)
    if len(a) % 32:
        raise ValueError("Q8_0 needs a multiple of 32 values, got %d" % len(a))
    out = bytearray()
    for i in range(0, len(a), 32):
        _q8_0_block(a[i:i + 32], out)
    return bytes(out)


def _engram_exponent(amax):
    """Smallest e with amax <= 448 * 2^e (exact), clamped to the E8M0 range [-127, 127]."""
    _, ex = math.frexp(amax)  # amax = m * 2^ex, m in [0.5, 1)
    e = ex - 9
    while amax > math.ldexp(448.0, e):
        e += 1
    while amax <= math.ldexp(448.0, e - 1):
        e -= 1
    return max(-127, min(127, e))


def encode_engram_rows(values, head_dim):
    """ENGRAM_ROW rows for values laid out as [rows][head_dim]; returns rows * (head_dim +
    head_dim/32) bytes, the payload of the I8 [row_bytes, rows] table tensor."""
    if head_dim <= 0 or head_dim % 32:
        raise ValueError("head_dim must be a positive multiple of 32")
    if _is_numpy(values):
        return _encode_engram_rows_np(values, head_dim)
    a = to_f32_array(values)
    if len(a) % head_dim:
        raise ValueError("%d values are not whole rows of %d" % (len(a), head_dim))
    out = bytearray()
    for r in range(0, len(a), head_dim):
        row = a[r:r + head_dim]
        codes = bytearray()
        scales = bytearray()
        for k in range(0, head_dim, 32):
            blk = row[k:k + 32]
            amax = 1e-4
            for v in blk:
                if v != v:
                    raise ValueError("NaN in Engram row")
                if abs(v) > amax:
                    amax = abs(v)
            if amax == math.inf:
                raise ValueError("Inf in Engram row")
            e = _engram_exponent(amax)
            scales.append(e + 127)
            for v in blk:
                # v / 2^e is exact in double; f32_to_e4m3 rounds it once (RNE).
                codes.append(f32_to_e4m3(math.ldexp(v, -e)))
        out += codes
        out += scales
    return bytes(out)


def _f32_to_e4m3_np(v):
    """sluice's f32_to_e4m3 on a float32 numpy array."""
    x = v.astype("<f4").view("<u4").astype(np.int64)
    sign = (x >> 24) & 0x80
    ax = x & 0x7FFFFFFF
    lsb = (ax >> 20) & 1
    code = np.minimum(((ax + 0x7FFFF + lsb) >> 20) - (120 << 3), 0x7E)
    r = (np.abs(v.astype("<f4")) + np.float32(16384.0)).astype("<f4").view("<u4").astype(np.int64)
    code = np.where(ax < 0x3C800000, r - 0x46800000, code)
    code = np.where(ax >= 0x43E00000, 0x7E, code)
    code = np.where(ax > 0x7F800000, 0x7F, code)
    return (sign | code).astype(np.uint8)


def _encode_engram_rows_np(values, head_dim):
    x = np.ascontiguousarray(values, dtype="<f4").reshape(-1)
    if x.size % head_dim:
        raise ValueError("%d values are not whole rows of %d" % (x.size, head_dim))
    if not np.isfinite(x).all():
        raise ValueError("non-finite value in Engram rows")
    rows = x.size // head_dim
    blk = x.reshape(rows, head_dim // 32, 32).astype(np.float64)
    amax = np.maximum(np.abs(blk).max(axis=2), 1e-4)
    _, ex = np.frexp(amax)
    e = ex.astype(np.int64) - 9
    for _ in range(4):
        e = np.where(amax > np.ldexp(448.0, e), e + 1, e)
    for _ in range(4):
        e = np.where(amax <= np.ldexp(448.0, e - 1), e - 1, e)
    e = np.clip(e, -127, 127)
    scaled = np.ldexp(blk, -e[:, :, None]).astype("<f4")  # exact, then one f32 rounding
    codes = _f32_to_e4m3_np(scaled).reshape(rows, head_dim)
    out = np.empty((rows, head_dim + head_dim // 32), dtype=np.uint8)
    out[:, :head_dim] = codes
    out[:, head_dim:] = (e + 127).astype(np.uint8)
    return out.tobytes()


# ---- decoders ------------------------------------------------------------------------------

def decode_f32(payload):
    a = array.array("f")
    a.frombytes(payload)
    return a.tolist()


def decode_f16(payload):
    return list(struct.unpack("<%de" % (len(payload) // 2), payload))


def decode_bf16(payload):
    h = array.array("H")
    h.frombytes(payload)
    a = array.array("f")
    a.frombytes(array.array("I", (x << 16 for x in h)).tobytes())
    return a.tolist()


def decode_q8_0(payload):
    out = array.array("f")
    for i in range(0, len(payload), 34):
        d = f16_bits_to_float(struct.unpack_from("<H", payload, i)[0])
        qs = struct.unpack_from("<32b", payload, i + 2)
        out.extend([q * d for q in qs])  # exact: 8-bit code times an fp16 scale
    return out.tolist()


def decode_engram_rows(payload, head_dim):
    rb = head_dim + head_dim // 32
    vals = []
    for r in range(0, len(payload), rb):
        row = payload[r:r + rb]
        for i in range(head_dim):
            s = e8m0_to_float(row[head_dim + i // 32])
            vals.append(_E4M3_TABLE[row[i]] * s)
    # f32(product) then bf16 RNE, as engram_value
    bits = _f32_bits(array.array("f", vals))
    a = array.array("f")
    a.frombytes(array.array("I", (f32_to_bf16_bits(x) << 16 for x in bits)).tobytes())
    return a.tolist()


ENCODERS = {"F32": encode_f32, "F16": encode_f16, "BF16": encode_bf16, "Q8_0": encode_q8_0}
DECODERS = {"F32": decode_f32, "F16": decode_f16, "BF16": decode_bf16, "Q8_0": decode_q8_0}


def encode_tensor(type_name, values):
    return ENCODERS[type_name](values)


def decode_tensor(type_name, payload):
    return DECODERS[type_name](payload)


if __name__ == "__main__":
    # python3 gguf_io.py FILE : print the metadata (arrays abbreviated) and tensor directory.
    g = read_gguf(sys.argv[1])
    print("GGUF v%d, alignment %d, data at %d, %d bytes" % (g.version, g.alignment, g.data_offset,
                                                           g.file_size))
    for k, v in g.kv.items():
        s = repr(v)
        print("  %s = %s" % (k, s if len(s) < 100 else s[:96] + " ... (%d)" % len(v)))
    for t in g.tensors:
        print("  ", t)
