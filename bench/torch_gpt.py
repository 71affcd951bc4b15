"""The peer to compare against: nanoGPT's model in eager PyTorch, trained on the same data with the same
recipe. Used by bench/compare_torch.sh (only when python3-torch is installed); not part of the build.

  python3 bench/torch_gpt.py --data FILE --threads 2 --iters 50   # prints one JSON line of timings
  python3 bench/torch_gpt.py --data FILE --device cuda --n-layer 6 --n-head 6 --n-embd 384 --block-size 256 \
      --batch-size 64 [--dtype bf16] [--compile]                   # the same on the GPU (TF32 on, as nanoGPT)
"""
import argparse
import contextlib
import ctypes
import json
import math
import re
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, n_embd, n_head, bias, block, dropout=0.0):
        super().__init__()
        self.n_head = n_head
        self.register_buffer("mask", torch.tril(torch.ones(block, block)))
        self.ln_1 = nn.LayerNorm(n_embd, bias=bias) if "bias" in nn.LayerNorm.__init__.__code__.co_varnames else nn.LayerNorm(n_embd)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.ln_2 = nn.LayerNorm(n_embd, bias=bias) if "bias" in nn.LayerNorm.__init__.__code__.co_varnames else nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd, bias=bias)
        self.mlp_proj = nn.Linear(4 * n_embd, n_embd, bias=bias)
        self.drop = nn.Dropout(dropout)
        self.dropout = dropout

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        else:  # nanoGPT's fallback for older torch (Debian 12 ships 1.13)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.mask[:T, :T] == 0, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        x = x + self.drop(self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C)))
        return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, vocab, block, n_layer, n_head, n_embd, bias, dropout=0.0):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(n_embd, n_head, bias, block, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * n_layer) if name.endswith("c_proj.weight") or name.endswith("mlp_proj.weight") else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        x = self.drop(self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device)))
        for block in self.h:
            x = block(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def describe(threads, optimizer="adamw"):
    """How this torch really runs, read at run time: its BLAS (the library mapped into the process and, for
    OpenBLAS, its threading and kernel set), its threads and the attention path; and what is wrong with that for a
    fair comparison (`problems`: compare_torch.sh refuses to report a ratio against a peer that has any)."""
    a = torch.randn(256, 256)
    (a @ a).sum().item()  # loads and initializes the BLAS
    maps = {line.split()[-1] for line in open("/proc/self/maps") if len(line.split()) >= 6}
    blas_libs = sorted(m for m in maps if re.search(r"(openblas|libblas\.so|mkl|libflexiblas)", m))
    info = {"torch": torch.__version__, "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(),
            "attention": "sdpa" if hasattr(F, "scaled_dot_product_attention") else "math (matmul, mask, softmax)",
            "blas": "unknown", "blas_libs": blas_libs}
    problems = []
    if torch.get_num_threads() != threads:
        problems.append(f"asked for {threads} threads, torch uses {torch.get_num_threads()}")
    config = torch.__config__.show()
    openblas = None
    for lib in blas_libs:
        try:
            handle = ctypes.CDLL(lib)
            handle.openblas_get_corename.restype = ctypes.c_char_p
            openblas = handle
            break
        except (OSError, AttributeError):
            continue
    if openblas is not None:
        mode = {0: "sequential", 1: "pthreads", 2: "OpenMP"}.get(openblas.openblas_get_parallel(), "?")
        info["blas"] = f"OpenBLAS ({mode}, {openblas.openblas_get_corename().decode()} kernels, " \
                       f"{openblas.openblas_get_num_threads()} threads)"
        flags = next((line for line in open("/proc/cpuinfo") if line.startswith("flags")), "").split()
        if openblas.openblas_get_corename().decode().lower() in ("prescott", "core2", "katmai") and "avx2" in flags:
            problems.append(f"OpenBLAS chose its {openblas.openblas_get_corename().decode()} (SSE) kernels on a CPU "
                            "with AVX2/AVX-512 (it does not recognize this CPU model): set OPENBLAS_CORETYPE "
                            "(Cooperlake, SkylakeX or Haswell, by what the CPU has)")
        if mode == "pthreads" and threads > 1 and openblas.openblas_get_num_threads() > 1:
            problems.append("pthread OpenBLAS runs its own threads beside torch's OpenMP threads (they fight over the "
                            "cores): install libopenblas0-openmp and put its directory first on LD_LIBRARY_PATH")
    elif "BLAS_INFO=mkl" in config or torch.backends.mkl.is_available():
        info["blas"] = "MKL" + (f" {m.group(1)}" if (m := re.search(r"Math Kernel Library Version ([0-9.]+)", config)) else "")
    elif any("libblas.so" in lib for lib in blas_libs):
        info["blas"] = "reference BLAS"
        problems.append("the reference BLAS (libblas3) is torch's BLAS: install libopenblas0-openmp")
    if optimizer == "muon" and not hasattr(torch.optim, "Muon"):
        problems.append(f"torch {torch.__version__} has no torch.optim.Muon (2.9 or later has it)")
    info["problems"] = problems
    return info


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=128)
    ap.add_argument("--block-size", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=12)
    ap.add_argument("--dropout", type=float, default=0.0)
    ap.add_argument("--seed", type=int, default=1337, help="weights and batches")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="f32", choices=["f32", "bf16"], help="bf16: autocast to bfloat16 (mixed precision) on the run's device")
    ap.add_argument("--no-tf32", action="store_true", help="full f32 matmuls on the GPU (default: TF32, as nanoGPT)")
    ap.add_argument("--optimizer", default="adamw", choices=["adamw", "muon"],
                    help="muon: torch.optim.Muon (Nesterov momentum 0.95, 5 Newton-Schulz steps, rate 0.02, weight decay "
                         "0.05) for the blocks' matrices and the fused AdamW for the rest, as tinygpt --optimizer muon")
    ap.add_argument("--compile", action="store_true", help="torch.compile the model")
    ap.add_argument("--compile-mode", default="default",
                    choices=["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"],
                    help="torch.compile's mode (with --compile)")
    ap.add_argument("--progress", action="store_true", help="print each timed iteration's time on stderr")
    ap.add_argument("--describe", action="store_true", help="print how torch runs here (BLAS, threads) and exit")
    ap.add_argument("--full-run", action="store_true",
                    help="train nanoGPT's CPU recipe for --iters iterations (LR schedule, clipping) and print the val loss")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    if a.describe:
        print(json.dumps(describe(a.threads, a.optimizer)))
        return
    torch.manual_seed(a.seed)
    dev = torch.device(a.device)
    if a.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = not a.no_tf32
        torch.backends.cudnn.allow_tf32 = not a.no_tf32
    text = open(a.data, encoding="utf-8").read()
    chars = sorted(set(text))
    stoi = {c: i for i, c in enumerate(chars)}
    data = torch.tensor([stoi[c] for c in text[: int(0.9 * len(text))]], dtype=torch.long)
    model = GPT(len(chars), a.block_size, a.n_layer, a.n_head, a.n_embd, bias=False, dropout=a.dropout).to(dev)
    # With --optimizer muon the blocks' matrices go to Muon (tinygpt's choice: transformer.h.*.weight, 2-D).
    muon_params = [p for n, p in model.named_parameters() if a.optimizer == "muon" and n.startswith("h.") and p.dim() == 2]
    rest = [p for p in model.parameters() if all(p is not m for m in muon_params)]
    decay = [p for p in rest if p.dim() >= 2]
    no_decay = [p for p in rest if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}]
    # The fused AdamW (one kernel over every parameter, on CUDA and, since torch 2.4, on the CPU), as a user at their
    # best would pick; where this torch has none, its multi-tensor one, and the output says which ran.
    try:
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), fused=True)
        adamw = "fused"
    except (RuntimeError, TypeError, ValueError) as e:
        opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99), foreach=True)
        adamw = f"foreach (no fused AdamW here: {e})"
    opts = [opt]
    if muon_params:
        if not hasattr(torch.optim, "Muon"):
            sys.exit(f"error: torch {torch.__version__} has no torch.optim.Muon (2.9 or later has it)")
        opts.append(torch.optim.Muon(muon_params, lr=0.02, weight_decay=0.05, momentum=0.95, nesterov=True, ns_steps=5))
    for o in opts:
        for group in o.param_groups:
            group["base_lr"] = group["lr"]
    val = torch.tensor([stoi[c] for c in text[int(0.9 * len(text)):]], dtype=torch.long)
    step_model = torch.compile(model, mode=a.compile_mode) if a.compile else model
    # (torch 1.13's autocast checks for bf16 on a GPU even when disabled)
    autocast = torch.autocast(a.device, dtype=torch.bfloat16) if a.dtype == "bf16" else contextlib.nullcontext()
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda: None)
    if a.full_run:
        a.warmup = 0

    def get_lr(it, warmup=100, lr=1e-3, min_lr=1e-4, decay=a.iters):
        if it < warmup:
            return lr * (it + 1) / (warmup + 1)
        return min_lr + 0.5 * (1.0 + math.cos(math.pi * (it - warmup) / (decay - warmup))) * (lr - min_lr)

    times = []
    for it in range(a.warmup + a.iters):
        if a.full_run:
            for o in opts:
                for group in o.param_groups:
                    group["lr"] = group["base_lr"] * get_lr(it) / 1e-3
        ix = torch.randint(len(data) - a.block_size, (a.batch_size,))
        x = torch.stack([data[i : i + a.block_size] for i in ix])
        y = torch.stack([data[i + 1 : i + 1 + a.block_size] for i in ix])
        x, y = x.to(dev), y.to(dev)
        sync()
        t0 = time.perf_counter()
        with autocast:
            loss = step_model(x, y)
        for o in opts:
            o.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        for o in opts:
            o.step()
        loss_value = loss.item()  # synchronizes, as tinygpt's loop does every iteration
        if it >= a.warmup:
            times.append(time.perf_counter() - t0)
            if a.progress:
                print(f"iter {it - a.warmup}: {1e3 * times[-1]:.1f} ms", file=sys.stderr, flush=True)
    if a.full_run:
        model.eval()
        with torch.no_grad():
            losses = []
            for _ in range(200):
                ix = torch.randint(len(val) - a.block_size, (a.batch_size,))
                x = torch.stack([val[i : i + a.block_size] for i in ix])
                y = torch.stack([val[i + 1 : i + 1 + a.block_size] for i in ix])
                losses.append(model(x.to(dev), y.to(dev)).item())
        print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "threads": torch.get_num_threads(),
                          "adamw": adamw, "seed": a.seed, "iters": a.iters, "val_loss": sum(losses) / len(losses)}))
        return
    times.sort()
    ms = 1e3 * times[len(times) // 2]
    tokens = a.batch_size * a.block_size
    print(json.dumps({"impl": "pytorch", "torch": torch.__version__, "device": a.device, "dtype": a.dtype,
                      "compile": a.compile and a.compile_mode, "optimizer": a.optimizer, "adamw": adamw, "threads": a.threads, "ms": ms, "tok_per_s": tokens / (ms / 1e3),
                      "loss": loss_value}))


if __name__ == "__main__":
    main()
