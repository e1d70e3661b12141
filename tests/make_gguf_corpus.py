#!/usr/bin/env python3
"""Writes tests/data/gguf_corpus/: small hand-made GGUF files, mostly malformed, plus
MANIFEST.txt with lines `<file> <expected substring of the error message>` (`OK` for the valid
control files, named valid_*.gguf). gguf_malformed_test.cpp opens every file and checks the
manifest. The files are committed; rerun this script only when the corpus changes.

Standard library only. Encodings follow quant-formats.md section 1 (GGUF v3, little-endian)."""

import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gguf_corpus")

# Value type ids (section 1.4)
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# Tensor type ids (section 0) that sluice can size today: (id, block elems, block bytes)
T_Q4_0, T_Q5_K, T_I8, T_I32, T_I64 = 2, 13, 24, 26, 27
GEOM = {T_Q4_0: (32, 18), T_Q5_K: (256, 176), T_I8: (1, 1), T_I32: (1, 4), T_I64: (1, 8)}

SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}


def u32(x):
    return struct.pack("<I", x)


def u64(x):
    return struct.pack("<Q", x)


def gstr(s, length=None):
    b = s.encode() if isinstance(s, str) else s
    return u64(len(b) if length is None else length) + b


def scalar(t, x):
    return struct.pack(SCALAR_FMT[t], x)


def array(t, xs, count=None):
    body = b"".join(gstr(x) if t == STRING else scalar(t, x) for x in xs)
    return u32(t) + u64(len(xs) if count is None else count) + body


def kv(key, t, payload):
    """One KV pair; payload is the already-encoded value."""
    return gstr(key) + u32(t) + payload


def nbytes(dims, ttype):
    qk, bb = GEOM[ttype]
    n = dims[0] // qk * bb
    for d in dims[1:]:
        n *= d
    return n


def tinfo(name, dims, ttype, offset, n_dims=None):
    return (gstr(name) + u32(len(dims) if n_dims is None else n_dims) +
            b"".join(u64(d) for d in dims) + u32(ttype) + u64(offset))


def align_up(x, a):
    return x + (a - x % a) % a


def gguf(kvs=(), tensors=(), version=3, magic=b"GGUF", n_tensors=None, n_kv=None,
         alignment=32, data=None, data_len=None):
    """kvs: encoded KV pairs; tensors: encoded records. The data section is `data` (bytes) or
    data_len bytes of a counting pattern, after zero padding to `alignment`."""
    head = (magic + u32(version) + u64(len(tensors) if n_tensors is None else n_tensors) +
            u64(len(kvs) if n_kv is None else n_kv))
    body = head + b"".join(kvs) + b"".join(tensors)
    if not tensors and data is None and data_len is None:
        return body
    body += b"\0" * (align_up(len(body), alignment) - len(body))
    if data is None:
        data = bytes(i * 7 % 251 for i in range(data_len or 0))
    return body + data


def layout(specs, alignment=32):
    """specs: (name, dims, type) -> encoded records laid out contiguously, total data bytes."""
    recs, off = [], 0
    for name, dims, t in specs:
        off = align_up(off, alignment)
        recs.append(tinfo(name, dims, t, off))
        off += nbytes(dims, t)
    return recs, align_up(off, alignment)


CASES = []  # (file name, bytes, expected substring)


def case(name, blob, expect):
    CASES.append((name, blob, expect))


def arch_kv():
    return kv("general.architecture", STRING, gstr("test"))


# ---- valid control files ----
BASIC_TENSORS = [("tok.weight", [8, 3], T_I32), ("blk.0.q", [64, 2], T_Q4_0),
                 ("blk.0.k", [256], T_Q5_K), ("ids", [5, 1, 1, 2], T_I8)]
BASIC_KVS = [arch_kv(), kv("general.alignment", U32, u32(32)),
             kv("test.count", U64, u64(12345)),
             kv("test.names", ARRAY, array(STRING, ["a", "", "tri-gram"])),
             kv("test.scales", ARRAY, array(F32, [0.5, -1.25]))]


def basic(**kw):
    recs, dlen = layout(BASIC_TENSORS)
    args = dict(kvs=BASIC_KVS, tensors=recs, data_len=dlen)
    args.update(kw)
    return gguf(**args)


case("valid_basic.gguf", basic(), "OK")
case("valid_v2.gguf", basic(version=2), "OK")
case("valid_empty.gguf", gguf(), "OK")
case("valid_no_tensors.gguf", gguf(kvs=[arch_kv()]), "OK")
recs64, dlen64 = layout(BASIC_TENSORS, 64)
case("valid_alignment_64.gguf",
     gguf(kvs=[arch_kv(), kv("general.alignment", U32, u32(64))], tensors=recs64, alignment=64,
          data_len=dlen64), "OK")
ALL_TYPES = [
    kv("t.u8", U8, scalar(U8, 255)), kv("t.i8", I8, scalar(I8, -128)),
    kv("t.u16", U16, scalar(U16, 65535)), kv("t.i16", I16, scalar(I16, -32768)),
    kv("t.u32", U32, scalar(U32, 2**32 - 1)), kv("t.i32", I32, scalar(I32, -2**31)),
    kv("t.f32", F32, scalar(F32, 1.5)), kv("t.bool", BOOL, scalar(BOOL, 1)),
    kv("t.str", STRING, gstr("")), kv("t.u64", U64, scalar(U64, 2**64 - 1)),
    kv("t.i64", I64, scalar(I64, -2**63)), kv("t.f64", F64, scalar(F64, -0.1)),
    kv("t.arr_empty", ARRAY, array(STRING, [])), kv("t.arr_bool", ARRAY, array(BOOL, [0, 1, 1])),
    kv("t.arr_i16", ARRAY, array(I16, [-1, 2])),
]
case("valid_all_value_types.gguf", gguf(kvs=ALL_TYPES), "OK")
# Records out of offset order with a gap: a tolerant reader only needs alignment + no overlap.
case("valid_unordered_offsets.gguf",
     gguf(kvs=[arch_kv()], tensors=[tinfo("second", [16], T_I32, 128), tinfo("first", [8], T_I32, 0)],
          data_len=192), "OK")
# A tensor of 63-byte name (the longest allowed).
case("valid_name_63.gguf", gguf(tensors=[tinfo("n" * 63, [4], T_I8, 0)], data_len=32), "OK")

# ---- truncation at (and inside) every header field ----
def field_offsets():
    """(field, offset) for each field of a small valid file, in file order. The first KV is a
    long string so that the early count checks pass and truncations reach the field reads."""
    desc = "d" * 120
    key = "general.names"
    tname = "blk.0.attn_output.weight.with.a.long.name"
    kvs = [kv("general.description", STRING, gstr(desc)), kv("general.version", U32, u32(7)),
           kv(key, ARRAY, array(STRING, ["ab", "cd"]))]
    recs = [tinfo(tname, [32, 2], T_Q4_0, 0)]
    blob = gguf(kvs=kvs, tensors=recs, data_len=nbytes([32, 2], T_Q4_0))
    fields = [("magic", 0), ("version", 4), ("tensor_count", 8), ("kv_count", 16)]
    p = 24
    fields += [("kv0_key_len", p), ("kv0_key", p + 8), ("kv0_type", p + 8 + 19),
               ("kv0_str_len", p + 8 + 19 + 4), ("kv0_str", p + 8 + 19 + 12)]
    p = 24 + len(kvs[0])
    fields += [("kv1_key_len", p), ("kv1_key", p + 8), ("kv1_type", p + 8 + 15),
               ("kv1_value", p + 8 + 15 + 4)]
    p += len(kvs[1])
    fields += [("kv2_key_len", p), ("kv2_key", p + 8)]
    p += 8 + len(key)
    fields += [("kv2_type", p), ("kv2_elem_type", p + 4), ("kv2_count", p + 8),
               ("kv2_elem0_len", p + 16), ("kv2_elem0", p + 24), ("kv2_elem1_len", p + 26),
               ("kv2_elem1", p + 34)]
    p = 24 + sum(len(k) for k in kvs)
    n = len(tname)
    fields += [("t0_name_len", p), ("t0_name", p + 8), ("t0_n_dims", p + 8 + n),
               ("t0_ne0", p + 12 + n), ("t0_ne1", p + 20 + n), ("t0_type", p + 28 + n),
               ("t0_offset", p + 32 + n)]
    assert p + 40 + n == 24 + sum(len(k) for k in kvs) + len(recs[0])
    return blob, fields


blob, fields = field_offsets()
for fname, off in fields:
    case("trunc_at_%s.gguf" % fname, blob[:off], "truncated")
    case("trunc_in_%s.gguf" % fname, blob[:off + 1], "truncated")
case("trunc_data.gguf", blob[:-1], "runs past the end of the file")

# ---- header ----
case("bad_magic.gguf", basic(magic=b"GGML"), "bad magic")
case("bad_magic_swapped.gguf", basic(magic=b"FUGG"), "bad magic")
for v in (0, 1, 4, 0x00010000, 0xFFFFFFFF):
    case("version_%#x.gguf" % v, basic(version=v), "unsupported GGUF version %d" % v)
# What a big-endian writer produces: every header field byte-swapped (the magic is four bytes).
for v in (2, 3):
    case("big_endian_v%d.gguf" % v, b"GGUF" + struct.pack(">IQQ", v, 0, 0), "big-endian GGUF is not supported")
case("huge_tensor_count.gguf", basic(n_tensors=2**60), "tensor_count %d exceeds the limit" % 2**60)
case("huge_tensor_count_max.gguf", basic(n_tensors=2**64 - 1), "exceeds the limit")
case("huge_kv_count.gguf", basic(n_kv=2**63), "kv_count %d exceeds the limit" % 2**63)
case("tensor_count_beyond_file.gguf", basic(n_tensors=1000), "tensor_count 1000 cannot fit")
case("kv_count_beyond_file.gguf", basic(n_kv=1000), "kv_count 1000 cannot fit")
# Counts that fit the early estimate but not the bytes left after the KVs.
case("tensor_count_too_big.gguf",
     gguf(kvs=BASIC_KVS, n_tensors=2) + tinfo("w", [4], T_I8, 0), "truncated")

# ---- strings and keys ----
case("huge_string_length.gguf",
     gguf(kvs=[kv("s", STRING, gstr("abc", length=2**62))]), "string length %d exceeds the limit" % 2**62)
case("huge_key_length.gguf", gguf(kvs=[gstr("k", length=2**64 - 1) + u32(U32) + u32(1)]),
     "key length %d exceeds the limit" % (2**64 - 1))
case("key_length_0.gguf", gguf(kvs=[kv("", U32, u32(1))]), "empty key")
case("string_past_eof.gguf", gguf(kvs=[kv("s", STRING, gstr("abc", length=1000))]),
     "string of 1000 bytes runs past")
case("key_past_eof.gguf", gguf(kvs=[gstr("key", length=500) + u32(U32) + u32(1)]),
     "key of 500 bytes runs past")
case("duplicate_key.gguf", gguf(kvs=[kv("a.b", U32, u32(1)), kv("x", U8, scalar(U8, 1)), kv("a.b", U8, scalar(U8, 2))]),
     "duplicate key 'a.b'")

# ---- value types ----
case("unknown_value_type_13.gguf", gguf(kvs=[kv("k", 13, u32(0))]), "unknown value type id 13")
case("unknown_value_type_max.gguf", gguf(kvs=[kv("k", 0xFFFFFFFF, u32(0))]), "unknown value type id 4294967295")
case("nested_array.gguf", gguf(kvs=[kv("k", ARRAY, u32(ARRAY) + u64(1) + array(U8, [1]))]), "nested array")
case("unknown_array_elem_type.gguf", gguf(kvs=[kv("k", ARRAY, u32(99) + u64(0))]), "unknown array element type id 99")
case("array_count_beyond_file.gguf", gguf(kvs=[kv("k", ARRAY, array(U32, [1, 2], count=1000))]),
     "array of 1000 uint32 elements cannot fit")
case("array_count_beyond_file_str.gguf", gguf(kvs=[kv("k", ARRAY, array(STRING, ["x"], count=100))]),
     "array of 100 string elements cannot fit")
case("array_count_huge.gguf", gguf(kvs=[kv("k", ARRAY, array(U8, [1], count=2**60))]),
     "array of %d elements exceeds the limit" % 2**60)
case("array_string_elem_past_eof.gguf", gguf(kvs=[kv("k", ARRAY, u32(STRING) + u64(2) + gstr("ab") + gstr("c", length=300))]),
     "string of 300 bytes runs past")
case("bool_2.gguf", gguf(kvs=[kv("k", BOOL, scalar(U8, 2))]), "bool value 2 is not 0 or 1")
case("bool_255_in_array.gguf", gguf(kvs=[kv("k", ARRAY, array(U8, [1, 0, 255]).replace(u32(U8), u32(BOOL), 1))]),
     "bool value 255 is not 0 or 1")

# ---- general.alignment ----
case("alignment_u64.gguf", basic(kvs=[kv("general.alignment", U64, u64(32))]), "general.alignment must be uint32, got uint64")
case("alignment_string.gguf", basic(kvs=[kv("general.alignment", STRING, gstr("32"))]), "general.alignment must be uint32, got string")
case("alignment_i32.gguf", basic(kvs=[kv("general.alignment", I32, scalar(I32, 32))]), "general.alignment must be uint32, got int32")
case("alignment_zero.gguf", basic(kvs=[kv("general.alignment", U32, u32(0))]), "general.alignment 0 is not a nonzero power of two")
case("alignment_48.gguf", basic(kvs=[kv("general.alignment", U32, u32(48))]), "general.alignment 48 is not a nonzero power of two")

# ---- tensor records ----
def one_tensor(rec, data_len=64, kvs=None):
    return gguf(kvs=[arch_kv()] if kvs is None else kvs, tensors=[rec], data_len=data_len)


case("ndims_0.gguf", one_tensor(tinfo("t", [], T_I8, 0)), "n_dims 0 out of range 1..4")
case("ndims_5.gguf", one_tensor(tinfo("t", [1, 1, 1, 1, 1], T_I8, 0)), "n_dims 5 out of range 1..4")
case("ndims_huge.gguf", one_tensor(tinfo("t", [1], T_I8, 0, n_dims=2**32 - 1)), "n_dims 4294967295 out of range")
case("dim_0.gguf", one_tensor(tinfo("t", [4, 0], T_I8, 0)), "ne[1] = 0 out of range")
case("dim_too_big.gguf", one_tensor(tinfo("t", [2**41], T_I8, 0)), "ne[0] = %d out of range" % 2**41)
case("dim_max.gguf", one_tensor(tinfo("t", [4, 2**64 - 1], T_I8, 0)), "out of range")
case("dims_product_overflow.gguf", one_tensor(tinfo("t", [2**40, 2**40], T_I8, 0)), "element count overflows")
case("dims_product_overflow_4d.gguf", one_tensor(tinfo("t", [2**20] * 4, T_I8, 0)), "element count overflows")
case("byte_size_overflow.gguf", one_tensor(tinfo("t", [2**40, 2**22], T_I64, 0)), "byte size overflows")
for t in (4, 5, 31, 33, 36, 38, 43, 99, 142, 1000, 2**32 - 1):
    case("tensor_type_%d.gguf" % t, one_tensor(tinfo("t", [256], t, 0), data_len=1024),
         "unknown tensor type id %d" % t)
case("ne0_not_block_multiple.gguf", one_tensor(tinfo("t", [33, 2], T_Q4_0, 0)),
     "ne[0] = 33 is not a multiple of the Q4_0 block size 32")
case("ne0_not_block_multiple_k.gguf", one_tensor(tinfo("t", [128], T_Q5_K, 0), data_len=256),
     "is not a multiple of the Q5_K block size 256")
case("tensor_name_64.gguf", one_tensor(tinfo("n" * 64, [4], T_I8, 0)), "tensor name of 64 bytes is too long")
case("tensor_name_huge.gguf", one_tensor(gstr("t", length=2**63) + u32(1) + u64(4) + u32(T_I8) + u64(0)),
     "tensor name of %d bytes is too long" % 2**63)
case("tensor_name_empty.gguf", one_tensor(tinfo("", [4], T_I8, 0)), "empty tensor name")
case("duplicate_tensor_name.gguf",
     gguf(tensors=[tinfo("w", [4], T_I8, 0), tinfo("w", [4], T_I8, 32)], data_len=64), "duplicate tensor name 'w'")

# ---- data section ----
case("misaligned_offset.gguf", one_tensor(tinfo("t", [4], T_I8, 16)), "offset 16 is not a multiple of the alignment 32")
case("misaligned_offset_64.gguf",
     gguf(kvs=[kv("general.alignment", U32, u32(64))], tensors=[tinfo("t", [4], T_I8, 32)], alignment=64, data_len=128),
     "offset 32 is not a multiple of the alignment 64")
case("tensor_past_eof.gguf", one_tensor(tinfo("t", [4], T_I8, 2**40)), "runs past the end of the file")
case("tensor_past_eof_by_one.gguf", one_tensor(tinfo("t", [65], T_I8, 0)), "runs past the end of the file")
case("tensor_past_eof_big.gguf", one_tensor(tinfo("t", [2**30, 2**10], T_I32, 0)), "runs past the end of the file")
case("overlapping_tensors.gguf",
     gguf(tensors=[tinfo("a", [64], T_I8, 0), tinfo("b", [16], T_I8, 32)], data_len=128), "overlaps tensor 'a'")
case("overlapping_tensors_same_offset.gguf",
     gguf(tensors=[tinfo("b", [16], T_I8, 64), tinfo("a", [16], T_I8, 64), tinfo("c", [4], T_I8, 0)], data_len=128),
     "overlaps tensor")
case("offset_overflow.gguf", one_tensor(tinfo("t", [4], T_I8, 2**64 - 1)), "overflows")
case("offset_overflow_aligned.gguf", one_tensor(tinfo("t", [4], T_I8, 2**64 - 32)), "overflows")


def main():
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        if f.endswith(".gguf"):
            os.remove(os.path.join(OUT, f))
    names = set()
    lines = []
    for name, blob, expect in CASES:
        assert name not in names, name
        assert len(blob) < 64 * 1024, name
        assert "\n" not in expect
        names.add(name)
        with open(os.path.join(OUT, name), "wb") as f:
            f.write(blob)
        lines.append("%s %s\n" % (name, expect))
    with open(os.path.join(OUT, "MANIFEST.txt"), "w") as f:
        f.write("# <file> <expected substring of the error message, or OK>; written by tests/make_gguf_corpus.py\n")
        f.writelines(lines)
    print("wrote %d files to %s" % (len(CASES), OUT), file=sys.stderr)


if __name__ == "__main__":
    main()
