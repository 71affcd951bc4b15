"""Checks `tinygpt export --format gguf` against the GGUF ecosystem's own code.

Models trained here (tinygpt's Llama shape with grouped-query heads, and with heads 24 wide of a 64-wide model, a Qwen2
shape with q/k/v biases and an untied head, GPT-2's shape), on a byte-level BPE that tinygpt trains, exported at f32, f16, bf16 and q8_0:

- read back by the `gguf` package (llama.cpp's gguf-py): the architecture, the hyperparameters and the tokenizer's
  tokens and merges as tinygpt's tokenizer.json has them, and every tensor equal to the checkpoint's (q and k rows
  permuted as llama.cpp's converter permutes them, written here again), rounded to f16 or bf16 by numpy and torch, and
  for q8_0 byte for byte what gguf's own quantizer (gguf.quants.quantize) makes of the checkpoint's f32 weights;
- run by llama.cpp (llama-cpp-python, built from its source): the prompt's ids, the logits against tinygpt's, and 32
  greedy tokens against `tinygpt sample --temperature 0`; the q8_0 file against llama.cpp's own quantization of the
  f32 one (llama_model_quantize), byte for byte.

Run by developers, not by CI (the packages are installed outside the source tree):

  /tmp/venv-hf/bin/pip install gguf llama-cpp-python torch numpy
  /tmp/venv-hf/bin/python tests/reference/check_gguf.py [--build build]

Exit status: 0 all checks pass, 1 a check fails, 77 gguf or numpy is missing (llama.cpp's part is skipped, saying so,
where llama-cpp-python is missing).
"""
import json
import pathlib
import struct
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import gguf
    import torch
except ImportError as e:
    print(f"skipped: {e.name} is not installed (/tmp/venv-hf/bin/pip install gguf numpy torch)")
    sys.exit(77)
try:
    import ctypes
    import llama_cpp
    import llama_cpp.llama

    # llama.cpp's extra buffer types (weights repacked for AVX-512 or AMX) off: with them llama-cpp-python 0.3.36
    # (AMX_INT8 on a Xeon of family 6, model 167) segfaults evaluating a q8_0 file, llama.cpp's own quantization of our
    # f32 export as well as ours.
    _default_params = llama_cpp.llama.llama_cpp.llama_model_default_params

    def _plain_buffers():
        params = _default_params()
        params.use_extra_bufts = False
        return params

    llama_cpp.llama.llama_cpp.llama_model_default_params = _plain_buffers
except ImportError:
    llama_cpp = None

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from check_hf_export import build_logits_tool, parse_args, read_safetensors, run  # noqa: E402

PROMPT = "ROMEO:\nWhat say you"
NEW_TOKENS = 32
TYPES = ["f32", "f16", "bf16", "q8_0"]


def safetensors_metadata(path):
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]).get("__metadata__", {})


def permute(w, heads):
    """llama.cpp's convert_hf_to_gguf.py LlamaModel.permute: rotary pairs (i, i + E/2) to (2j, 2j + 1)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def expected_tensors(ckpt, config, arch):
    """The checkpoint's tensors under llama.cpp's names, as its converter would lay them out (f32)."""
    c = config
    C, L, NH = c["n_embd"], c["n_layer"], c["n_head"]
    NKV = c.get("n_kv_head") or NH
    E = c.get("head_dim") or C // NH
    t = {"token_embd.weight": ckpt["transformer.wte.weight"]}
    if arch == "gpt2":
        t["position_embd.weight"] = ckpt["transformer.wpe.weight"]
    zeros = lambda n: np.zeros(n, np.float32)  # noqa: E731
    for i in range(L):
        h, g = f"transformer.h.{i}.", f"blk.{i}."
        t[g + "attn_norm.weight"] = ckpt[h + "ln_1.weight"]
        t[g + "ffn_norm.weight"] = ckpt[h + "ln_2.weight"]
        t[g + "attn_output.weight"] = ckpt[h + "attn.c_proj.weight"]
        t[g + "ffn_down.weight"] = ckpt[h + "mlp.c_proj.weight"]
        qkv = ckpt[h + "attn.c_attn.weight"]
        if arch == "gpt2":
            t[g + "attn_qkv.weight"] = qkv
            t[g + "ffn_up.weight"] = ckpt[h + "mlp.c_fc.weight"]
            for name, ours, n in [("attn_norm.bias", "ln_1.bias", C), ("ffn_norm.bias", "ln_2.bias", C),
                                  ("attn_qkv.bias", "attn.c_attn.bias", 3 * C), ("attn_output.bias", "attn.c_proj.bias", C),
                                  ("ffn_up.bias", "mlp.c_fc.bias", 4 * C), ("ffn_down.bias", "mlp.c_proj.bias", C)]:
                t[g + name] = ckpt.get(h + ours, zeros(n))
            continue
        q, kv = NH * E, NKV * E
        parts = {"attn_q": (0, q, NH), "attn_k": (q, kv, NKV), "attn_v": (q + kv, kv, None)}
        for name, (r0, rows, heads) in parts.items():
            for suffix in ["weight", "bias"]:
                src = h + "attn.c_attn." + suffix
                if src not in ckpt:
                    continue
                w = ckpt[src][r0:r0 + rows]
                t[f"{g}{name}.{suffix}"] = permute(w, heads) if heads and arch == "llama" else w
        H = ckpt[h + "mlp.c_fc.weight"].shape[0] // 2
        t[g + "ffn_gate.weight"] = ckpt[h + "mlp.c_fc.weight"][:H]
        t[g + "ffn_up.weight"] = ckpt[h + "mlp.c_fc.weight"][H:]
    t["output_norm.weight"] = ckpt["transformer.ln_f.weight"]
    if arch == "gpt2":
        t["output_norm.bias"] = ckpt.get("transformer.ln_f.bias", zeros(C))
    if "lm_head.weight" in ckpt:
        t["output.weight"] = ckpt["lm_head.weight"]
    return t


def rounded(name, x, kind):
    """x as a file of `kind` holds it: the matrices rounded, vectors and the position table f32 (as llama.cpp's
    converter keeps them); q8_0 as gguf's quantizer's bytes."""
    if x.ndim == 1 or kind == "f32" or name == "position_embd.weight":
        return x.astype(np.float32)
    if kind == "f16":
        return x.astype(np.float16)
    if kind == "bf16":
        return torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    if x.shape[-1] % 32 != 0:
        return x.astype(np.float16)  # tinygpt writes such matrices f16
    return gguf.quants.quantize(x, gguf.GGMLQuantizationType.Q8_0)


def field(reader, key):
    f = reader.fields[key]
    if f.types[0] == gguf.GGUFValueType.ARRAY:
        if f.types[1] == gguf.GGUFValueType.STRING:
            return [bytes(f.parts[i]).decode("utf-8") for i in f.data]
        return [f.parts[i].tolist()[0] for i in f.data]
    if f.types[0] == gguf.GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8")
    return f.parts[f.data[0]].tolist()[0]


def check_file(path, ckpt, config, tok_json, arch, kind):
    """The file read by gguf-py against the checkpoint; True when all agree."""
    reader = gguf.GGUFReader(path)
    problems = []
    if field(reader, "general.architecture") != arch:
        problems.append(f"architecture {field(reader, 'general.architecture')}")
    for key, want in [("context_length", config["block_size"]), ("embedding_length", config["n_embd"]),
                      ("block_count", config["n_layer"]), ("attention.head_count", config["n_head"])]:
        if field(reader, f"{arch}.{key}") != want:
            problems.append(f"{key} {field(reader, f'{arch}.{key}')} (want {want})")
    vocab = tok_json["model"]["vocab"]
    tokens = field(reader, "tokenizer.ggml.tokens")
    want_tokens = [None] * len(tokens)
    for text, i in vocab.items():
        want_tokens[i] = text
    for a in tok_json["added_tokens"]:
        want_tokens[a["id"]] = a["content"]
    if tokens != want_tokens:
        problems.append("tokens differ from tokenizer.json's")
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]]
    if field(reader, "tokenizer.ggml.merges") != merges:
        problems.append("merges differ from tokenizer.json's")
    expected = expected_tensors(ckpt, config, arch)
    got = {t.name: t for t in reader.tensors}
    if set(got) != set(expected):
        problems.append(f"tensor names differ: {sorted(set(got) ^ set(expected))}")
    for name, want in expected.items():
        if name not in got:
            continue
        t = got[name]
        data = np.asarray(t.data)
        ref = rounded(name, want, kind)
        if data.dtype != ref.dtype or data.size != ref.size:
            data = data.view(ref.dtype) if data.nbytes == ref.nbytes else data
        if data.reshape(-1).tobytes() != np.ascontiguousarray(ref).reshape(-1).tobytes():
            problems.append(f"{name} ({t.tensor_type.name}) differs")
    print(f"{path.name:<22} gguf-py reads {len(got)} tensors, {len(tokens)} tokens: "
          f"{'all as expected' if not problems else 'PROBLEMS: ' + '; '.join(problems[:4])}")
    return not problems


def check_quantized_by_llama_cpp(path, f32_path, tmp):
    """Our q8_0 file against llama.cpp's own quantization (llama_model_quantize) of our f32 file: the same bytes."""
    theirs = tmp / f"{path.stem}-by-llama.cpp.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = 7  # LLAMA_FTYPE_MOSTLY_Q8_0
    if llama_cpp.llama_model_quantize(str(f32_path).encode(), str(theirs).encode(), ctypes.byref(params)) != 0:
        print(f"{path.name:<22} llama_model_quantize FAILED")
        return False
    ours, ref = ({t.name: t for t in gguf.GGUFReader(p).tensors} for p in (path, theirs))
    differ = [n for n in ref if n not in ours or ours[n].tensor_type != ref[n].tensor_type
              or np.asarray(ours[n].data).tobytes() != np.asarray(ref[n].data).tobytes()]
    print(f"{path.name:<22} against llama.cpp's quantization of the f32 file: "
          f"{'the same types and bytes in all ' + str(len(ref)) + ' tensors' if not differ else 'DIFFER: ' + str(differ[:4])}")
    return not differ and set(ours) == set(ref)


def check_llama_cpp(path, tinygpt, tool, run_dir, tmp, kind):
    """llama.cpp runs the file: the prompt's ids, logits and greedy tokens against tinygpt's."""
    dump = tmp / f"{path.stem}-logits.safetensors"
    run(tool, run_dir, PROMPT, dump)
    ours = read_safetensors(dump)
    ids = ours["ids"].reshape(-1).tolist()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_threads=2, logits_all=True, verbose=False)
    theirs_ids = llm.tokenize(PROMPT.encode(), add_bos=False, special=False)
    llm.eval(ids)
    logits = np.array(llm.scores[:len(ids)])
    diff = float(np.abs(logits - ours["logits"].reshape(len(ids), -1)).max())
    llm.reset()
    out = []
    for tok in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        out.append(tok)
        if len(out) == NEW_TOKENS:
            break
    theirs_text = llm.detokenize(out)
    ours_text = subprocess.run([str(tinygpt), "sample", "--ckpt", str(run_dir), "--prompt", PROMPT, "--temperature",
                                "0", "--max-new-tokens", str(NEW_TOKENS)], check=True,
                               capture_output=True).stdout.removesuffix(b"\n")
    ours_text = ours_text[len(PROMPT.encode()):]
    same_ids, same_text = theirs_ids == ids, ours_text == theirs_text
    tolerance = {"f32": 1e-3, "f16": 5e-2, "bf16": 2e-1, "q8_0": 2e-1}[kind]
    print(f"{path.name:<22} llama.cpp: ids {'same' if same_ids else 'DIFFER'}, max |logits diff| {diff:.2e} "
          f"(<= {tolerance:g}), greedy text {'same' if same_text else 'DIFFERS'}")
    if not same_text:
        print(f"{'':<22}   tinygpt:   {ours_text!r}\n{'':<22}   llama.cpp: {theirs_text!r}")
    return same_ids and diff <= tolerance and (same_text or kind != "f32")


def import_llama3_scaled(tinygpt, tok, tmp):
    """A LlamaForCausalLM with Llama 3's RoPE scaling (factor 8, original context 32; transformers, random weights)
    imported into tmp/llama3; returns the run directory."""
    import transformers
    hf_dir = tmp / "llama3-hf"
    torch.manual_seed(3)
    config = transformers.LlamaConfig(
        vocab_size=1024, hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=128, rope_theta=1e5,
        rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                          original_max_position_embeddings=32))
    transformers.LlamaForCausalLM(config).save_pretrained(hf_dir)
    (hf_dir / "tokenizer.json").write_bytes(tok.read_bytes())
    run(tinygpt, "import", "--format", "hf", "--from", hf_dir, "--out", tmp / "llama3")
    return tmp / "llama3"


def check_llama3_scaling(tinygpt, tool, tok, tmp):
    """Llama 3's RoPE scaling through GGUF: a LlamaForCausalLM with it (transformers, random weights) imported, exported
    at f32 (the scaling as rope_freqs.weight) and run by llama.cpp against tinygpt's logits."""
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("llama3-scaled: transformers is not installed: skipped")
        return True
    import_llama3_scaled(tinygpt, tok, tmp)
    path = tmp / "llama3-f32.gguf"
    run(tinygpt, "export", "--ckpt", tmp / "llama3", "--format", "gguf", "--out", path)
    names = {t.name for t in gguf.GGUFReader(path).tensors}
    print(f"{path.name:<22} rope_freqs.weight {'written' if 'rope_freqs.weight' in names else 'MISSING'}")
    return "rope_freqs.weight" in names and check_llama_cpp(path, tinygpt, tool, tmp / "llama3", tmp, "f32")


def main():
    args, build = parse_args(__doc__)
    print(f"gguf {gguf.__version__ if hasattr(gguf, '__version__') else '?'}, "
          f"llama-cpp-python {llama_cpp.__version__ if llama_cpp else 'absent: the llama.cpp part is skipped'}")
    models = {"llama": (["--arch", "llama", "--n-kv-head", 2], "llama"),
              "qwen2": (["--arch", "llama", "--n-kv-head", 2, "--qkv-bias", "--untied-head"], "qwen2"),
              "gpt2": ([], "gpt2"),
              "llama-head24": (["--arch", "llama", "--n-kv-head", 2, "--head-dim", 24], "llama")}
    results = []
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        tinygpt, tool = build_logits_tool(build, tmp)
        tok = tmp / "tokenizer.json"
        run(tinygpt, "tokenizer", "train", "--data", args.data, "--vocab-size", 1024, "--out", tok)
        tok_json = json.loads(tok.read_text())
        for name, (flags, arch) in models.items():
            run_dir = tmp / name
            run(tinygpt, "train", "--data", args.data, "--tokenizer", tok, "--out", run_dir, "--n-layer", 2,
                "--n-head", 4, "--n-embd", 64, "--block-size", 64, "--batch-size", 8, "--max-iters", 300,
                "--lr-decay-iters", 300, "--eval-interval", 300, "--eval-iters", 2, *flags)
            best = run_dir / "ckpt_best.safetensors"
            ckpt, config = read_safetensors(best), json.loads(safetensors_metadata(best)["config"])
            for kind in TYPES:
                path = tmp / f"{name}-{kind}.gguf"
                run(tinygpt, "export", "--ckpt", run_dir, "--format", "gguf", "--type", kind, "--out", path)
                results.append(check_file(path, ckpt, config, tok_json, arch, kind))
                if llama_cpp:
                    if kind == "q8_0":
                        results.append(check_quantized_by_llama_cpp(path, tmp / f"{name}-f32.gguf", tmp))
                    results.append(check_llama_cpp(path, tinygpt, tool, run_dir, tmp, kind))
        if llama_cpp:
            results.append(check_llama3_scaling(tinygpt, tool, tok, tmp))
    ok = all(results)
    print("GGUF checked: gguf-py and llama.cpp read what tinygpt wrote" if ok else "FAIL: a check differs")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
