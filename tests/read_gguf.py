"""A GGUF v3 file read with Python's standard library only (for the tests: no gguf package needed), checked against
the checkpoint it was exported from.

  python3 tests/read_gguf.py FILE.gguf CHECKPOINT.safetensors ARCH TYPE

Checks the header (magic, version 3, alignment), the architecture and block count, the token count against the
vocabulary, every tensor's offset and size inside the file, and the values of the tensors exported without a
permutation (token_embd, the norms, ffn_down, and attn_v where there is one): equal for f32, within half a step of
q8_0's block scale for q8_0 (dequantized as ggml dequantizes), within f16's or bf16's rounding for those. Prints one
line and exits 0, or prints what differs and exits 1.
"""
import json
import struct
import sys

TYPES = {0: ("F32", 4), 1: ("F16", 2), 8: ("Q8_0", 34 / 32), 30: ("BF16", 2)}


class Reader:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt):
        v = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return v[0] if len(v) == 1 else v

    def string(self):
        n = self.take("Q")
        s = self.data[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def value(self, t):
        scalar = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
        if t in scalar:
            return self.take(scalar[t])
        if t == 8:
            return self.string()
        if t == 9:
            et, n = self.take("I"), self.take("Q")
            return [self.value(et) for _ in range(n)]
        raise ValueError(f"unknown value type {t}")


def floats(data, offset, n, kind):
    if kind == "F32":
        return list(struct.unpack_from(f"<{n}f", data, offset))
    if kind == "F16":
        return list(struct.unpack_from(f"<{n}e", data, offset))
    if kind == "BF16":
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in struct.unpack_from(f"<{n}H", data, offset)]
    out = []  # Q8_0: blocks of an f16 scale d and 32 int8s; x = d * q
    for b in range(n // 32):
        d = struct.unpack_from("<e", data, offset + 34 * b)[0]
        out += [d * q for q in struct.unpack_from("<32b", data, offset + 34 * b + 2)]
    return out


def safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        a, b = info["data_offsets"]
        if info["dtype"] == "F32":
            out[name] = list(struct.unpack_from(f"<{(b - a) // 4}f", data, 8 + n + a))
    return out, meta


def main():
    path, ckpt_path, arch, kind = sys.argv[1:5]
    data = open(path, "rb").read()
    r = Reader(data)
    problems = []
    if r.take("4s") != b"GGUF" or r.take("I") != 3:
        print("FAIL: not a GGUF v3 file")
        sys.exit(1)
    n_tensors, n_kv = r.take("Q"), r.take("Q")
    kv = {}
    for _ in range(n_kv):
        key = r.string()
        kv[key] = r.value(r.take("I"))
    infos = []
    for _ in range(n_tensors):
        name, nd = r.string(), r.take("I")
        dims = [r.take("Q") for _ in range(nd)]
        infos.append((name, dims, r.take("I"), r.take("Q")))
    align = kv.get("general.alignment", 32)
    start = (r.pos + align - 1) // align * align
    ckpt, meta = safetensors(ckpt_path)
    config = json.loads(meta["config"])
    if kv.get("general.architecture") != arch:
        problems.append(f"architecture {kv.get('general.architecture')}")
    if kv.get(f"{arch}.block_count") != config["n_layer"]:
        problems.append(f"block_count {kv.get(f'{arch}.block_count')}")
    if len(kv.get("tokenizer.ggml.tokens", [])) != config["vocab_size"]:
        problems.append("the token count is not the vocabulary's")
    L = config["n_layer"]
    E = config.get("head_dim") or config["n_embd"] // config["n_head"]
    q = config["n_head"] * E
    kvr = (config.get("n_kv_head") or config["n_head"]) * E
    same = {"token_embd.weight": ("transformer.wte.weight", None), "output_norm.weight": ("transformer.ln_f.weight", None)}
    for i in range(L):
        h = f"transformer.h.{i}."
        same[f"blk.{i}.attn_norm.weight"] = (h + "ln_1.weight", None)
        same[f"blk.{i}.ffn_down.weight"] = (h + "mlp.c_proj.weight", None)
        if arch != "gpt2":
            same[f"blk.{i}.attn_v.weight"] = (h + "attn.c_attn.weight", (q + kvr, kvr))
    checked = 0
    for name, dims, t, offset in infos:
        type_name, size = TYPES.get(t, ("?", 0))
        n = 1
        for d in dims:
            n *= d
        if start + offset + int(n * size) > len(data) or offset % align:
            problems.append(f"{name} lies outside the file or unaligned")
            continue
        if name not in same:
            continue
        ours, rows = same[name]
        want = ckpt[ours]
        if rows:
            want = want[rows[0] * dims[0]:(rows[0] + rows[1]) * dims[0]]
        got = floats(data, start + offset, n, type_name)
        if len(got) != len(want):
            problems.append(f"{name}: {len(got)} values, the checkpoint's {len(want)}")
            continue
        for b in range(0, len(want), 32):
            block = want[b:b + 32]
            scale = max(abs(x) for x in block)
            tol = {"F32": 0.0, "F16": scale * 2 ** -10, "BF16": scale * 2 ** -7, "Q8_0": scale / 127 * 0.5001 + scale * 2 ** -10}[type_name]
            if any(abs(g - w) > tol + 1e-30 for g, w in zip(got[b:b + 32], block)):
                problems.append(f"{name} ({type_name}) differs near value {b}")
                break
        checked += 1
    if problems:
        print("FAIL: " + "; ".join(problems[:5]))
        sys.exit(1)
    print(f"{path}: GGUF v3, {arch}, {n_tensors} tensors, {len(kv['tokenizer.ggml.tokens'])} tokens, {checked} tensors "
          f"equal to the checkpoint's ({kind})")


if __name__ == "__main__":
    main()
