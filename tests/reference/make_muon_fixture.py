"""Writes tests/reference/muon_fixture.safetensors: 20 optimizer steps of torch.optim.Muon (the block matrices) beside
torch.optim.AdamW (everything else), and of AdamW alone, on parameters named and shaped as a GPT's (a tall, a wide
and a square block matrix; an embedding; a gain; a bias), for test_train's "Muon agrees with PyTorch" case to check
tinygpt's Muon and AdamW against, step by step. Run by developers when the optimizers' semantics change (it needs
PyTorch >= 2.9, installed outside the source tree); tests/torch_reference_test.sh also runs it live, into a temporary
file from other random numbers, when a torch is present:

  python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch numpy
  /tmp/venv-torch/bin/python tests/reference/make_muon_fixture.py

The loss of each step is sum over parameters of sum(D * (p - T)^2 + S * p^3 / 3) with fixed random D > 0, T and S
(the cubic term makes the gradient's direction change as p moves), its gradient clipped to a global norm of
MAX_NORM as clip_grad_norm_ does, the rates following a warmup and a decay, the matrices' rate muon_lr times the
schedule's fraction. torch.optim.Muon orthogonalizes in bfloat16; tinygpt computes in float32, so the reference swaps
in the same quintic Newton-Schulz iteration in float32 (torch's own code with the cast to bfloat16 left out); every
other line of the update is torch.optim.Muon's and torch.optim.AdamW's own.
"""
import json
import pathlib
import sys

import torch
import torch.optim._muon as muon_module

from fixture_io import save_safetensors

OUT = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).with_name("muon_fixture.safetensors")
SEED_OFFSET = int(sys.argv[2]) if len(sys.argv) > 2 else 0
STEPS = 20
MAX_NORM = 73.0  # between the first and the last steps' norms (about 77 to 71): early steps are clipped, late ones not

PARAMS = [  # name, shape: the order of tinygpt's FlatParameters in the test
    ("transformer.h.0.mlp.c_proj.weight", (8, 32)),   # wide (out < in): Muon
    ("transformer.h.0.mlp.c_fc.bias", (32,)),         # AdamW, no decay
    ("transformer.h.0.mlp.c_fc.weight", (32, 8)),     # tall: Muon, scaled by sqrt(32 / 8) in "original"
    ("transformer.h.0.attn.c_proj.weight", (8, 8)),   # square: Muon
    ("transformer.h.0.ln_1.weight", (8,)),            # AdamW, no decay
    ("transformer.wte.weight", (11, 8)),              # embedding: AdamW with decay
]
CASES = [
    dict(name="muon_original_nesterov", optimizer="muon", adjust_lr_fn="original", nesterov=True, muon_wd=0.1),
    dict(name="muon_match_adamw_plain", optimizer="muon", adjust_lr_fn="match_rms_adamw", nesterov=False, muon_wd=0.0),
    dict(name="adamw", optimizer="adamw"),
]
ADAMW = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
MUON_LR, MOMENTUM = 0.02, 0.95


def newton_schulz_f32(grad, ns_coefficients, ns_steps, eps):
    """torch.optim._muon._zeropower_via_newtonschulz without the cast to bfloat16."""
    a, b, c = ns_coefficients
    x = grad.clone()
    if grad.size(0) > grad.size(1):
        x = x.T
    x.div_(x.norm().clamp(min=eps))
    for _ in range(ns_steps):
        gram = x @ x.T
        update = torch.addmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.addmm(x, update, x, beta=a)
    if grad.size(0) > grad.size(1):
        x = x.T
    return x


muon_module._zeropower_via_newtonschulz = newton_schulz_f32


def schedule(step):  # the fraction of the peak rate at step 0..STEPS-1: warmup over 3 steps, then linear decay to 0.1
    return (step + 1) / 4 if step < 3 else 1.0 - 0.9 * (step - 3) / (STEPS - 4)


def run(case, g):
    params = {n: torch.nn.Parameter(torch.randn(s, generator=g) * 0.5) for n, s in PARAMS}
    data = {n: (torch.rand(s, generator=g) * 1.5 + 0.5, torch.randn(s, generator=g), torch.randn(s, generator=g) * 0.3)
            for n, s in PARAMS}
    tensors = {f"{case['name']}.init.{n}": p.detach().clone() for n, p in params.items()}
    for n, (d, t, s) in data.items():
        tensors[f"{case['name']}.D.{n}"], tensors[f"{case['name']}.T.{n}"], tensors[f"{case['name']}.S.{n}"] = d, t, s
    is_muon = lambda n, p: case["optimizer"] == "muon" and p.ndim == 2 and n.startswith("transformer.h.")
    decayed = [p for n, p in params.items() if not is_muon(n, p) and p.ndim >= 2]
    plain = [p for n, p in params.items() if not is_muon(n, p) and p.ndim < 2]
    adamw = torch.optim.AdamW([dict(params=decayed), dict(params=plain, weight_decay=0.0)], **ADAMW)
    optimizers = [adamw]
    if case["optimizer"] == "muon":
        optimizers.append(torch.optim.Muon([p for n, p in params.items() if is_muon(n, p)], lr=MUON_LR,
                                           weight_decay=case["muon_wd"], momentum=MOMENTUM, nesterov=case["nesterov"],
                                           adjust_lr_fn=case["adjust_lr_fn"]))
    bases = [[group["lr"] for group in opt.param_groups] for opt in optimizers]
    for step in range(STEPS):
        for opt, base in zip(optimizers, bases):
            for group, lr in zip(opt.param_groups, base):
                group["lr"] = lr * schedule(step)
            opt.zero_grad()
        loss = sum((d * (params[n] - t) ** 2 + s * params[n] ** 3 / 3).sum() for n, (d, t, s) in data.items())
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(params.values()), MAX_NORM)
        tensors[f"{case['name']}.grad_norm.{step}"] = norm.detach().reshape(1).clone()
        for opt in optimizers:
            opt.step()
        for n, p in params.items():
            tensors[f"{case['name']}.step{step}.{n}"] = p.detach().clone()
    for opt in optimizers:
        for p, st in opt.state.items():
            name = next(n for n, q in params.items() if q is p)
            for key, value in st.items():
                if key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
                    tensors[f"{case['name']}.state.{name}.{key}"] = value.detach().clone()
    return tensors


def main():
    torch.manual_seed(0)
    tensors = {}
    for i, case in enumerate(CASES):
        tensors.update(run(case, torch.Generator().manual_seed(1000 * SEED_OFFSET + i)))
    meta = dict(steps=STEPS, max_norm=MAX_NORM, adamw_lr=ADAMW["lr"], beta1=ADAMW["betas"][0], beta2=ADAMW["betas"][1],
                eps=ADAMW["eps"], weight_decay=ADAMW["weight_decay"], muon_lr=MUON_LR, momentum=MOMENTUM,
                schedule=[schedule(s) for s in range(STEPS)], params=[[n, list(s)] for n, s in PARAMS], cases=CASES)
    save_safetensors(OUT, tensors, {"torch": torch.__version__, "config": json.dumps(meta)})
    print(f"wrote {OUT}: {len(CASES)} cases, {STEPS} steps (torch {torch.__version__})")


if __name__ == "__main__":
    main()
