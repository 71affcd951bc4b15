"""Writes tests/reference/gpt_fixture.safetensors: a tiny nanoGPT-architecture model's weights, a batch, and
what PyTorch computes for it (logits, loss, every parameter's gradient), to check
tinygpt against (test_gpt.cpp). Run by developers when the model changes, not by CI:

  /usr/bin/python3 tests/reference/make_gpt_fixture.py     # needs Debian's python3-torch

The model is written out here (not imported) so the fixture does not depend on any other repository; it
follows nanoGPT's model.py: pre-LayerNorm blocks, causal attention, GELU (tanh) MLP, tied LM head, GPT-2
initialization. The weights are rounded to float32 (what tinygpt trains in) and the reference computed in
float64, so the expected values carry no float32 rounding of their own.
"""
import json
import math
import pathlib

import torch
import torch.nn.functional as F

from fixture_io import save_safetensors

VOCAB, BLOCK, N_LAYER, N_HEAD, N_EMBD = 13, 8, 2, 2, 16
B, T = 3, 8
OUT = pathlib.Path(__file__).with_name("gpt_fixture.safetensors")


def make_weights(gen):
    w = {}

    def normal(name, *shape, std=0.02):
        w[name] = torch.randn(*shape, generator=gen, dtype=torch.float64) * std

    def small(name, *shape):  # biases and LayerNorm parameters away from their init, so their gradients matter
        w[name] = torch.randn(*shape, generator=gen, dtype=torch.float64) * 0.1

    normal("transformer.wte.weight", VOCAB, N_EMBD)
    normal("transformer.wpe.weight", BLOCK, N_EMBD)
    proj_std = 0.02 / math.sqrt(2 * N_LAYER)
    for i in range(N_LAYER):
        p = f"transformer.h.{i}."
        w[p + "ln_1.weight"] = 1 + torch.randn(N_EMBD, generator=gen, dtype=torch.float64) * 0.1
        small(p + "ln_1.bias", N_EMBD)
        normal(p + "attn.c_attn.weight", 3 * N_EMBD, N_EMBD)
        small(p + "attn.c_attn.bias", 3 * N_EMBD)
        normal(p + "attn.c_proj.weight", N_EMBD, N_EMBD, std=proj_std)
        small(p + "attn.c_proj.bias", N_EMBD)
        w[p + "ln_2.weight"] = 1 + torch.randn(N_EMBD, generator=gen, dtype=torch.float64) * 0.1
        small(p + "ln_2.bias", N_EMBD)
        normal(p + "mlp.c_fc.weight", 4 * N_EMBD, N_EMBD)
        small(p + "mlp.c_fc.bias", 4 * N_EMBD)
        normal(p + "mlp.c_proj.weight", N_EMBD, 4 * N_EMBD, std=proj_std)
        small(p + "mlp.c_proj.bias", N_EMBD)
    w["transformer.ln_f.weight"] = 1 + torch.randn(N_EMBD, generator=gen, dtype=torch.float64) * 0.1
    small("transformer.ln_f.bias", N_EMBD)
    # Round to float32, as tinygpt holds them; the computation below stays in float64.
    return {k: v.float().double().requires_grad_() for k, v in w.items()}


def forward(w, idx, targets):
    x = w["transformer.wte.weight"][idx] + w["transformer.wpe.weight"][torch.arange(T)]
    hs = N_EMBD // N_HEAD
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    for i in range(N_LAYER):
        p = f"transformer.h.{i}."
        h = F.layer_norm(x, (N_EMBD,), w[p + "ln_1.weight"], w[p + "ln_1.bias"], 1e-5)
        q, k, v = F.linear(h, w[p + "attn.c_attn.weight"], w[p + "attn.c_attn.bias"]).split(N_EMBD, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, hs).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(hs)
        att = F.softmax(att.masked_fill(~causal, float("-inf")), dim=-1)
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, N_EMBD)
        x = x + F.linear(y, w[p + "attn.c_proj.weight"], w[p + "attn.c_proj.bias"])
        h = F.layer_norm(x, (N_EMBD,), w[p + "ln_2.weight"], w[p + "ln_2.bias"], 1e-5)
        h = F.gelu(F.linear(h, w[p + "mlp.c_fc.weight"], w[p + "mlp.c_fc.bias"]), approximate="tanh")
        x = x + F.linear(h, w[p + "mlp.c_proj.weight"], w[p + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (N_EMBD,), w["transformer.ln_f.weight"], w["transformer.ln_f.bias"], 1e-5)
    logits = F.linear(x, w["transformer.wte.weight"])  # tied LM head
    return logits, F.cross_entropy(logits.view(-1, VOCAB), targets.view(-1))



def main():
    gen = torch.Generator().manual_seed(1234)
    w = make_weights(gen)
    idx = torch.randint(VOCAB, (B, T), generator=gen)
    targets = torch.randint(VOCAB, (B, T), generator=gen)
    logits, loss = forward(w, idx, targets)
    loss.backward()
    tensors = {name: t.detach().float() for name, t in w.items()}
    tensors["input.x"] = idx.int()
    tensors["input.y"] = targets.int()
    tensors["expected.logits"] = logits.detach()
    tensors["expected.loss"] = loss.detach().reshape(1)
    for name, t in w.items():
        tensors["expected.grad." + name] = t.grad
    config = {"vocab_size": VOCAB, "block_size": BLOCK, "n_layer": N_LAYER, "n_head": N_HEAD, "n_embd": N_EMBD,
              "bias": True}
    save_safetensors(OUT, tensors, {"config": json.dumps(config), "torch": torch.__version__})
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes), loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
