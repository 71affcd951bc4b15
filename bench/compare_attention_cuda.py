"""Flash attention on the GPU, tinygpt against PyTorch's scaled_dot_product_attention, side by side in one run.

  python3 bench/compare_attention_cuda.py [--bench build/bench/bench_attention] [--quick] [--bf16]

Runs `bench_attention --device cuda --json` (tinygpt's flash kernels with f32 operands on CUDA cores, "flash",
and with tf32 and bf16 operands on tensor cores, "flash_tf32" and "flash_bf16"), then times torch's
scaled_dot_product_attention on the same shapes and layout (B, NH, T, E): in f32 against "flash" and "flash_tf32"
(torch picks its memory-efficient kernel) and in bf16 against "flash_bf16" and "flash_bf16_storage" (torch picks its
flash kernel). "flash_tf32" and "flash_bf16" read and write f32 tensors (tf32 or bf16 is their operand precision);
"flash_bf16_storage" reads and writes bf16 tensors, as torch's bf16 run does (its forward is the bf16-storage kernel,
its backward the bf16-operand kernels on widened copies). Forward, backward (forward+backward minus forward) and
forward+backward, with FlashAttention's FLOP count: 4*B*T^2*NH*E forward, halved when causal; backward 2.5x
forward. Both sides are timed alike: the best of 5 calls after a warm-up, each from the host up to a device
synchronisation.
"""
import argparse
import json
import subprocess
import time

import torch
import torch.nn.functional as F


def time_ms(fn, reps=5):
    """Best of `reps` calls after one warm-up, each timed on the host up to a device synchronisation: what
    bench_attention does for tinygpt, so both sides share the timer and the statistic."""
    fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best


def torch_row(B, NH, T, E, causal, dtype):
    q, k, v, dout = (torch.randn(B, NH, T, E, device="cuda", dtype=dtype) for _ in range(4))
    for t in (q, k, v):
        t.requires_grad_()

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def fwd_bwd():
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        out.backward(dout)

    return time_ms(fwd), time_ms(fwd_bwd)


def sdpa_kernels(dtype):
    """The GPU kernels one scaled_dot_product_attention call runs (forward and backward), as the profiler names them:
    which of torch's attention paths the comparison measures."""
    q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
            torch.cuda.synchronize()
        names = {e.key for e in prof.key_averages()}
    except Exception as e:  # the profiler is a check, not the benchmark
        return f"(could not tell: {e})"
    picked = sorted(n for n in names if any(w in n.lower() for w in ("flash", "fmha", "attention", "efficient", "cudnn")))
    return ", ".join(n[:80] for n in picked) or "(no attention kernel named)"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default="build/bench/bench_attention")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--bf16", action="store_true", help="only the bf16 rows (and torch's bf16)")
    a = ap.parse_args()
    args = [a.bench, "--device", "cuda", "--json"] + (["--quick"] if a.quick else []) + (["--bf16"] if a.bf16 else [])
    rows = [json.loads(line) for line in subprocess.run(args, check=True, capture_output=True, text=True).stdout.splitlines()]
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}; inputs (B, NH, T, E); TF/s as FlashAttention counts")
    for dtype in (torch.float32, torch.bfloat16):
        print(f"torch sdpa {str(dtype).replace('torch.', '')}: {sdpa_kernels(dtype)}")
    print(f"{'impl':<20} {'dtype':>5} {'B':>3} {'NH':>3} {'T':>5} {'E':>4} {'causal':>6} {'fwd ms':>8} {'fwd TF/s':>9} "
          f"{'bwd ms':>8} {'bwd TF/s':>9} {'f+b ms':>8} {'f+b TF/s':>9} {'fwd vs torch':>12} {'bwd vs torch':>12} "
          f"{'f+b vs torch':>12}")
    torch_times = {}
    for r in rows:
        B, NH, T, E, causal = r["B"], r["NH"], r["T"], r["E"], r["causal"]
        flops = 4.0 * B * NH * T * T * E * (0.5 if causal else 1.0)
        tf = lambda ms, mult=1.0: mult * flops / (ms * 1e-3) / 1e12 if ms > 0 else float("nan")

        def line(impl, dtype, fwd, both, vs=""):
            bwd = both - fwd
            print(f"{impl:<20} {dtype:>5} {B:>3} {NH:>3} {T:>5} {E:>4} {'yes' if causal else 'no':>6} {fwd:>8.3f} "
                  f"{tf(fwd):>9.2f} {bwd:>8.3f} {tf(bwd, 2.5):>9.2f} {both:>8.3f} {tf(both, 3.5):>9.2f} {vs}")

        if r["impl"] == "naive":
            line("naive", "f32", r["fwd_ms"], r["fwd_bwd_ms"])
            continue
        dtype = "bf16" if r["impl"].startswith("flash_bf16") else "f32"
        key = (B, NH, T, E, causal, dtype)
        if key not in torch_times:
            torch_times[key] = torch_row(B, NH, T, E, causal, torch.bfloat16 if dtype == "bf16" else torch.float32)
            line("torch", dtype, *torch_times[key])
        t_fwd, t_both = torch_times[key]
        ours_bwd, torch_bwd = r["fwd_bwd_ms"] - r["fwd_ms"], t_both - t_fwd
        line("tinygpt:" + r["impl"], dtype, r["fwd_ms"], r["fwd_bwd_ms"],
             f"{t_fwd / r['fwd_ms']:>11.2f}x {torch_bwd / ours_bwd:>11.2f}x {t_both / r['fwd_bwd_ms']:>11.2f}x")


if __name__ == "__main__":
    main()
