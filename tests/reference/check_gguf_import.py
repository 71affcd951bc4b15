"""Checks `tinygpt import --format gguf` against the GGUF ecosystem's own code.

Models made by transformers with random weights (a LlamaForCausalLM with grouped-query heads and an untied head, a
Qwen2ForCausalLM with q/k/v biases and a tied head, a GPT2LMHeadModel), on a byte-level BPE that tinygpt trains,
written to GGUF (tinygpt's f32 export) and quantized by llama.cpp's own quantizer (llama-cpp-python's
llama_model_quantize) to F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K_M, Q5_K_M and Q6_K, then imported by tinygpt:

- every tensor of the imported checkpoint, laid out as llama.cpp's converter lays it out (q and k permuted for the
  llama architecture), equal bit for bit to the `gguf` package's dequantization of the file (gguf.quants.dequantize);
- the logits of the imported model against those of transformers loading the same file
  (from_pretrained(..., gguf_file=...)), to 1e-4;
- the file exported again at f32 by tinygpt: the same tensors as the import read;
- Llama 3's RoPE scaling (rope_freqs.weight) read back as the scaling it was written from.

Run by developers, not by CI (the packages are installed outside the source tree):

  /tmp/venv-hf/bin/pip install gguf llama-cpp-python transformers torch numpy
  /tmp/venv-hf/bin/python tests/reference/check_gguf_import.py [--build build]

Exit status: 0 all checks pass, 1 a check fails, 77 a package is missing.
"""
import ctypes
import json
import pathlib
import sys
import tempfile

try:
    import numpy as np
    import gguf
    import torch
    import transformers
    import llama_cpp
except ImportError as e:
    print(f"skipped: {e.name} is not installed (/tmp/venv-hf/bin/pip install gguf llama-cpp-python transformers torch)")
    sys.exit(77)

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from check_gguf import expected_tensors, import_llama3_scaled, safetensors_metadata  # noqa: E402
from check_hf_export import build_logits_tool, parse_args, read_safetensors, run  # noqa: E402

PROMPT = "ROMEO:\nWhat say you, my lord"
# llama.cpp's file types (llama_ftype) and the tensor types they hold.
FTYPES = {"F16": 1, "BF16": 32, "Q8_0": 7, "Q4_0": 2, "Q4_1": 3, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15, "Q5_K_M": 17,
          "Q6_K": 18}


def models(tmp):
    """The three transformers models, saved with random weights (seeded) and the shared tokenizer."""
    torch.manual_seed(7)
    common = dict(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, max_position_embeddings=128, rope_theta=1e4)
    out = {
        "llama": transformers.LlamaForCausalLM(transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False,
                                                                        **common)),
        "qwen2": transformers.Qwen2ForCausalLM(transformers.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True,
                                                                        **common)),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=1024, n_embd=256, n_layer=2, n_head=4,
                                                                     n_positions=128)),
    }
    for name, model in out.items():
        with torch.no_grad():  # weights of a trained model's size, not the 0.02 init alone, so quantization matters
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.05)
        model.save_pretrained(tmp / f"{name}-hf")
    return list(out)


def quantize(src, dst, ftype):
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    return llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0


def dequantized(path):
    """Every tensor of the file as f32 (gguf-py's dequantization), in tinygpt's row-major shape."""
    out, types = {}, set()
    for t in gguf.GGUFReader(path).tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        out[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        types.add(t.tensor_type.name)
    return out, types


def check_one(name, kind, path, tinygpt, tool, tmp):
    run_dir = tmp / f"{name}-{kind}-imported"
    run(tinygpt, "import", "--format", "gguf", "--from", path, "--out", run_dir)
    ckpt_path = run_dir / "ckpt_latest.safetensors"
    ckpt, config = read_safetensors(ckpt_path), json.loads(safetensors_metadata(ckpt_path)["config"])
    theirs, types = dequantized(path)
    ours = expected_tensors(ckpt, config, name)
    differ = [n for n in theirs if n not in ours or ours[n].shape != theirs[n].shape
              or ours[n].astype(np.float32).tobytes() != theirs[n].tobytes()]
    differ += [n for n in ours if n not in theirs]
    # transformers reads the same file (dequantized by gguf-py, q and k un-permuted by its own code)
    dump = tmp / f"{name}-{kind}-logits.safetensors"
    run(tool, run_dir, PROMPT, dump)
    got = read_safetensors(dump)
    ids = got["ids"].reshape(-1).tolist()
    # transformers 5.24 reads gpt2's context_length as n_ctx and leaves n_positions at 1024: given here
    extra = {"n_positions": config["block_size"]} if name == "gpt2" else {}
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              dtype=torch.float32, **extra)
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    diff = float(np.abs(ref - got["logits"].reshape(len(ids), -1)).max())
    # exported again at f32: the tensors the import read
    again = tmp / f"{name}-{kind}-again.gguf"
    run(tinygpt, "export", "--ckpt", run_dir, "--format", "gguf", "--out", again)
    back, _ = dequantized(again)
    same_back = set(back) == set(theirs) and all(back[n].tobytes() == theirs[n].tobytes() for n in back)
    ok = not differ and diff <= 1e-4 and same_back
    print(f"{name:<6} {kind:<7} {len(theirs):>3} tensors ({', '.join(sorted(types))}): "
          f"{'all equal gguf-py' if not differ else 'DIFFER: ' + ', '.join(differ[:4])}; "
          f"max |logits - transformers'| {diff:.1e} (<= 1e-4); f32 export again {'the same' if same_back else 'DIFFERS'}")
    return ok


def check_llama3_scaling(tinygpt, tool, tok, tmp):
    """Llama 3's RoPE scaling through rope_freqs.weight: a LlamaForCausalLM with it imported from Hugging Face, exported
    f32 and imported from GGUF has the same scaling in its config and the same logits as the Hugging Face import."""
    import_llama3_scaled(tinygpt, tok, tmp)
    run(tinygpt, "export", "--ckpt", tmp / "llama3", "--format", "gguf", "--out", tmp / "llama3.gguf")
    run(tinygpt, "import", "--format", "gguf", "--from", tmp / "llama3.gguf", "--out", tmp / "llama3-back")
    configs = [json.loads(safetensors_metadata(tmp / r / "ckpt_latest.safetensors")["config"]) for r in ("llama3", "llama3-back")]
    logits = []
    for r in ("llama3", "llama3-back"):
        run(tool, tmp / r, PROMPT, tmp / f"{r}.logits")
        logits.append(read_safetensors(tmp / f"{r}.logits")["logits"])
    diff = float(np.abs(logits[0] - logits[1]).max())
    same = configs[0].get("rope_scaling") == configs[1].get("rope_scaling")
    print(f"llama3-scaled: rope_scaling {'the same' if same else 'DIFFERS'} ({configs[1].get('rope_scaling')}), "
          f"max |logits difference| {diff:.1e} (== 0)")
    return same and diff == 0


def main():
    args, build = parse_args(__doc__)
    print(f"gguf {getattr(gguf, '__version__', '?')}, llama-cpp-python {llama_cpp.__version__}, "
          f"transformers {transformers.__version__}")
    results = []
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        tinygpt, tool = build_logits_tool(build, tmp)
        tok = tmp / "tokenizer.json"
        run(tinygpt, "tokenizer", "train", "--data", args.data, "--vocab-size", 1024, "--out", tok)
        for name in models(tmp):
            hf_dir = tmp / f"{name}-hf"
            (hf_dir / "tokenizer.json").write_bytes(tok.read_bytes())
            run(tinygpt, "import", "--format", "hf", "--from", hf_dir, "--out", tmp / name)
            (tmp / name / "gguf").mkdir()
            base = tmp / name / "gguf" / "model-F32.gguf"
            run(tinygpt, "export", "--ckpt", tmp / name, "--format", "gguf", "--out", base)
            results.append(check_one(name, "F32", base, tinygpt, tool, tmp))
            for kind, ftype in FTYPES.items():
                path = base.with_name(f"model-{kind}.gguf")
                if not quantize(base, path, ftype):
                    print(f"{name:<6} {kind:<7} llama_model_quantize FAILED")
                    results.append(False)
                    continue
                results.append(check_one(name, kind, path, tinygpt, tool, tmp))
        results.append(check_llama3_scaling(tinygpt, tool, tok, tmp))
    ok = all(results)
    print("GGUF import checked: tinygpt reads what gguf-py and transformers read" if ok else "FAIL: a check differs")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
