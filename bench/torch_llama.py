"""The peer of a Llama fine-tuning step: transformers' LlamaForCausalLM of a given shape (SmolLM2-135M's by default),
one AdamW step (fused) on a batch of random tokens, timed in PyTorch eager and torch.compile, f32 and autocast bf16,
with SDPA attention; prints one line per configuration (min, median and max ms of the timed steps) and the
configuration checked at run time (threads, BLAS, attention implementation). Never needed by the build or the tests.

  python bench/torch_llama.py [--batch 4] [--context 512] [--steps 3] [--threads 2] [--only eager-f32,...]

Compare with `tinygpt train --init-from RUN --block-size 512 --batch-size 4 --dtype bf16` on the same shape
(bench/compare_llama.sh runs both, side by side).
"""
import argparse
import statistics
import time

import torch
import transformers


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--only", default="eager-f32,eager-bf16,compile-f32,compile-bf16")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    cfg = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=576, intermediate_size=1536,
                                   num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                                   max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=1e5,
                                   tie_word_embeddings=True, attn_implementation="sdpa")
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, threads {torch.get_num_threads()}, "
          f"MKL {torch.backends.mkl.is_available()}, mkldnn {torch.backends.mkldnn.is_available()}, "
          f"attention {cfg._attn_implementation}")
    gen = torch.Generator().manual_seed(0)
    x = torch.randint(0, args.vocab, (args.batch, args.context), generator=gen)
    for name in args.only.split(","):
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(cfg).train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
        bf16 = name.endswith("bf16")

        def step():
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = model(input_ids=x, labels=x).loss  # transformers shifts the labels itself
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        run = torch.compile(step) if name.startswith("compile") else step
        t0 = time.perf_counter()
        run()  # warm-up (and compilation)
        first = time.perf_counter() - t0
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e3)
        params = sum(p.numel() for p in model.parameters())
        print(f"{name:<13} {params / 1e6:.1f}M parameters, batch {args.batch} x {args.context}: ms/step min "
              f"{min(times):.0f} median {statistics.median(times):.0f} max {max(times):.0f} (first step {first:.1f} s)",
              flush=True)


if __name__ == "__main__":
    main()
