"""Decoding speed, one sequence with the KV cache: `tinygpt sample` against llama.cpp on the same weights, side by side.

The model is SmolLM2-135M's shape (30 layers x 576, 9 heads, 3 key/value heads, MLP 1536, vocabulary 49,152, tied
head), made by transformers with random bf16 weights and imported with `tinygpt import --format hf` (its tokenizer a
BPE trained here on the text, the embedding padded past it). The same checkpoint is exported to GGUF by tinygpt (f16,
bf16, q8_0) and quantized by llama.cpp (Q4_K_M from the f16 file). Each engine greedy-decodes NEW tokens after a short
prompt with THREADS threads, ROUNDS times, alternating; the table gives tokens per second (min / median / max) of the
decoding alone (llama.cpp: from the first generated token to the last; tinygpt: its own timing line less nothing, the
prompt being 3 tokens), and the bytes of weights each token reads.

llama.cpp (llama-cpp-python, built from its source) is measured with its extra buffer types (weights repacked for
AVX-512 / AMX) on and off, and the faster is its row; its configuration is printed.

  /tmp/venv-hf/bin/python bench/compare_decode.py [--build build] [--threads 2] [--new 128] [--rounds 3]
"""
import argparse
import ctypes
import json
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import transformers
import llama_cpp
import llama_cpp.llama

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROMPT = "ROMEO:"


def make_model(tinygpt, data, tmp):
    tok = tmp / "tok.json"
    subprocess.run([tinygpt, "tokenizer", "train", "--data", data, "--vocab-size", "2048", "--out", tok], check=True,
                   capture_output=True)
    cfg = transformers.LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                                   rms_norm_eps=1e-5, rope_theta=1e5, tie_word_embeddings=True)
    torch.manual_seed(0)
    hf = tmp / "hf"
    transformers.LlamaForCausalLM(cfg).to(torch.bfloat16).save_pretrained(hf)
    (hf / "tokenizer.json").write_bytes(tok.read_bytes())
    subprocess.run([tinygpt, "import", "--format", "hf", "--from", hf, "--out", tmp / "run"], check=True,
                   capture_output=True)
    params = sum(p.numel() for p in transformers.LlamaForCausalLM(cfg).parameters())
    return tmp / "run", params


def tinygpt_rate(tinygpt, run, threads, new, dtype):
    out = subprocess.run([tinygpt, "--threads", str(threads), "sample", "--ckpt", run, "--prompt", PROMPT,
                          "--max-new-tokens", str(new), "--temperature", "0", "--dtype", dtype],
                         check=True, capture_output=True, text=True, errors="replace")  # a random model: not always UTF-8
    m = re.search(r"(\d+) tokens in ([0-9.]+)s", out.stderr)
    return int(m.group(1)) / float(m.group(2))


def llama_rate(path, threads, new, extra_bufts):
    default = llama_cpp.llama_cpp.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = extra_bufts
        return p

    llama_cpp.llama.llama_cpp.llama_model_default_params = params
    try:
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=max(256, new + 16), n_threads=threads,
                              n_threads_batch=threads, verbose=False)
    finally:
        llama_cpp.llama.llama_cpp.llama_model_default_params = default
    ids = llm.tokenize(PROMPT.encode(), add_bos=False)
    n, t0 = 0, None
    for _ in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0):
        n += 1
        if n == 1:
            t0 = time.perf_counter()  # the prompt is in; from here on each token is one decoding step
        if n == new:
            break
    rate = (n - 1) / (time.perf_counter() - t0)
    del llm
    return rate


def llama_rate_apart(path, threads, new, extra_bufts):
    """llama_rate in a process of its own: llama-cpp-python 0.3.36 segfaults on some files with extra buffers on."""
    r = subprocess.run([sys.executable, __file__, "--one", str(path), str(threads), str(new), str(int(extra_bufts))],
                       capture_output=True, text=True)
    return float(r.stdout) if r.returncode == 0 else None


def main():
    if len(sys.argv) == 6 and sys.argv[1] == "--one":
        print(llama_rate(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5] == "1"))
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=str(ROOT / "build"))
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    tinygpt = str(pathlib.Path(args.build).resolve() / "tinygpt")
    cpu = open("/proc/cpuinfo").read()
    field = lambda k: re.search(rf"^{k}\s*: (.*)$", cpu, re.M).group(1)  # noqa: E731
    print(f"machine: {field('model name')}, family {field('cpu family')}, model {field('model')}; {args.threads} "
          f"threads; llama-cpp-python {llama_cpp.__version__}; {llama_cpp.llama_print_system_info().decode().strip()}")
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        run, params = make_model(tinygpt, args.data, tmp)
        files = {}
        for kind in ["f16", "bf16", "q8_0"]:
            files[kind] = tmp / f"model-{kind}.gguf"
            subprocess.run([tinygpt, "export", "--ckpt", run, "--format", "gguf", "--type", kind, "--out",
                            files[kind]], check=True, capture_output=True)
        files["q4_K_M"] = tmp / "model-q4_K_M.gguf"
        q = llama_cpp.llama_model_quantize_default_params()
        q.ftype = 15
        assert llama_cpp.llama_model_quantize(str(files["f16"]).encode(), str(files["q4_K_M"]).encode(),
                                              ctypes.byref(q)) == 0
        rows = {}
        for _ in range(args.rounds):
            for dtype in ["fp32", "bf16"]:
                rows.setdefault(f"tinygpt sample --dtype {dtype}", []).append(
                    tinygpt_rate(tinygpt, run, args.threads, args.new, dtype))
            for kind, path in files.items():
                for extra in [True, False]:
                    rows.setdefault(f"llama.cpp {kind} (extra buffers {'on' if extra else 'off'})", []).append(
                        llama_rate_apart(path, args.threads, args.new, extra))
        sizes = {k: v.stat().st_size for k, v in files.items()}
    print(f"model: {params / 1e6:.1f}M parameters; GGUF sizes: "
          + ", ".join(f"{k} {v / 2**20:.0f} MiB" for k, v in sizes.items()))
    print(f"\n| engine | tokens/s min / median / max ({args.rounds} rounds, {args.new} tokens) |\n|---|---|")
    for name, r in rows.items():
        if None in r:
            print(f"| {name} | crashed in {r.count(None)} of {len(r)} rounds |")
        else:
            print(f"| {name} | {min(r):.1f} / {statistics.median(r):.1f} / {max(r):.1f} |")


if __name__ == "__main__":
    main()
