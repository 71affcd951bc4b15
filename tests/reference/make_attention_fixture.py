"""Writes tests/reference/attention_fixture.safetensors: for a matrix of configurations, the weights and inputs of
an attention layer and what PyTorch computes for them (output, attention weights, and the gradient of every input
and parameter), for test_attention_reference.cpp to check tinygpt against. Run by developers when the attention
semantics change (it needs PyTorch, installed outside the source tree); tests/torch_reference_test.sh also runs it live, into a
temporary file from other random numbers, when a torch is present:

  python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch numpy
  /tmp/venv-torch/bin/python tests/reference/make_attention_fixture.py

Four kinds of case:
  mha       torch.nn.MultiheadAttention(batch_first=True, dropout=0) itself: self and cross attention, kdim/vdim
            different from embed_dim, bias on and off, key_padding_mask, bool and float attn_mask in 2-D (T, S) and
            per-head 3-D (B * NH, T, S) form, causal masking, need_weights averaged and per head.
  sdpa      F.scaled_dot_product_attention with grouped-query heads: k and v repeated per group on the torch side
            (query head h reads key/value head h // G), masks in the functional convention (true = attend).
  mha_rope  self-attention with grouped-query heads and rotary embeddings, composed in plain torch: one fused QKV
            projection, the half-split rotation (GPT-NeoX / LLaMA layout), F.scaled_dot_product_attention, the output
            projection.
  mha (extra) torch.nn.MultiheadAttention's remaining options, drawn from a generator of their own after the cases
            above (whose values stay as they were): add_bias_kv (tinygpt's bias_k, bias_v of (1, 1, E) as torch's),
            add_zero_attn, both, and batch_first=False (sequence-first (T, B, E) inputs and outputs), with and without
            key_padding_mask and attn_mask, causal, need_weights averaged and per head. With the appended key
            positions torch's is_causal is only a hint: where it goes to F.scaled_dot_product_attention (no weights, no
            key_padding_mask) torch masks the appended keys too (top-left causal over S + 1 keys), everywhere else it
            uses attn_mask padded with a visible column. tinygpt does the latter always, so these cases give torch
            the causal mask (bottom-right over the S real keys, as tinygpt's is_causal) without the is_causal hint.
Every case differentiates loss = sum(out * dout) + sum(weights * dweights) (the second term only when weights are
returned), so a loss on the weights has to reach q, k and the projections as it does in torch. Inputs and weights
are rounded to float32 (what tinygpt computes in); the reference runs in float64. The float64 expectations of a rerun
may differ from the committed ones in the last bits on another machine (its BLAS); the inputs and weights do not.
"""
import json
import math
import pathlib
import sys

import torch
import torch.nn.functional as F

from fixture_io import save_safetensors

# Arguments (tests/torch_reference_test.sh): an output path instead of the committed fixture, and a seed offset that
# draws other numbers for the same cases.
OUT = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).with_name("attention_fixture.safetensors")
SEED_OFFSET = int(sys.argv[2]) if len(sys.argv) > 2 else 0
B, T, S = 2, 5, 7

# name, kind, options. mask: none | bool2 | float2 | bool3 | float3 (torch's (B * NH, T, S)); causal: is_causal.
MHA_CASES = [
    dict(name="self_plain", E=8, NH=2, bias=True, need_weights=True, average=True),
    dict(name="self_padding_per_head", E=8, NH=2, bias=True, padding=True, need_weights=True, average=False),
    dict(name="self_bool2_nobias", E=8, NH=2, bias=False, mask="bool2", need_weights=True, average=True),
    dict(name="self_float2_per_head", E=12, NH=3, bias=True, mask="float2", need_weights=True, average=False),
    dict(name="self_bool3_padding", E=8, NH=2, bias=True, mask="bool3", padding=True, need_weights=True, average=True),
    dict(name="self_float3_per_head", E=8, NH=4, bias=True, mask="float3", need_weights=True, average=False),
    dict(name="self_causal_no_weights", E=8, NH=2, bias=True, causal=True, need_weights=False),
    dict(name="self_causal_padding_per_head", E=8, NH=2, bias=False, causal=True, padding=True, need_weights=True,
         average=False),
    dict(name="cross_fused_padding", E=8, NH=2, bias=True, cross=True, padding=True, need_weights=True, average=True),
    dict(name="cross_kdim_vdim_float2", E=8, NH=2, kdim=6, vdim=5, bias=True, cross=True, mask="float2",
         need_weights=True, average=False),
    dict(name="cross_kdim_vdim_bool3_nobias", E=8, NH=4, kdim=5, vdim=3, bias=False, cross=True, mask="bool3",
         need_weights=False),
    dict(name="cross_kdim_vdim_padding_avg", E=6, NH=3, kdim=4, vdim=7, bias=True, cross=True, padding=True,
         need_weights=True, average=True),
]
# torch.nn.MultiheadAttention's add_bias_kv (bias_kv), add_zero_attn (zero_attn) and batch_first=False (seq_first).
MHA_EXTRA_CASES = [
    dict(name="bias_kv_self_avg", E=8, NH=2, bias=True, add_bias_kv=True, need_weights=True, average=True),
    dict(name="bias_kv_self_padding_per_head", E=8, NH=2, bias=True, add_bias_kv=True, padding=True,
         need_weights=True, average=False),
    dict(name="bias_kv_nobias_cross_fused_bool3", E=8, NH=2, bias=False, add_bias_kv=True, cross=True, mask="bool3",
         need_weights=False),
    dict(name="bias_kv_causal_per_head", E=8, NH=2, bias=True, add_bias_kv=True, causal=True, need_weights=True,
         average=False),
    dict(name="zero_attn_self_bool2", E=8, NH=2, bias=True, add_zero_attn=True, mask="bool2", need_weights=True,
         average=True),
    dict(name="zero_attn_causal_float2_no_weights", E=12, NH=3, bias=True, add_zero_attn=True, causal=True,
         mask="float2", need_weights=False),
    dict(name="zero_attn_cross_kdim_vdim_per_head", E=8, NH=4, kdim=6, vdim=5, bias=True, add_zero_attn=True,
         cross=True, need_weights=True, average=False),
    dict(name="both_self_float3_padding_per_head", E=8, NH=2, bias=True, add_bias_kv=True, add_zero_attn=True,
         mask="float3", padding=True, need_weights=True, average=False),
    dict(name="both_cross_kdim_vdim_padding_avg", E=6, NH=3, kdim=4, vdim=7, bias=True, add_bias_kv=True,
         add_zero_attn=True, cross=True, padding=True, need_weights=True, average=True),
    dict(name="both_causal_bool2_padding_no_weights", E=8, NH=2, bias=False, add_bias_kv=True, add_zero_attn=True,
         causal=True, mask="bool2", padding=True, need_weights=False),
    dict(name="seq_first_self_avg", E=8, NH=2, bias=True, batch_first=False, need_weights=True, average=True),
    dict(name="seq_first_self_causal_no_weights", E=8, NH=2, bias=True, batch_first=False, causal=True,
         need_weights=False),
    dict(name="seq_first_cross_kdim_vdim_padding_float2_per_head", E=8, NH=2, kdim=6, vdim=5, bias=True,
         batch_first=False, cross=True, padding=True, mask="float2", need_weights=True, average=False),
    dict(name="seq_first_cross_fused_bool3_no_weights", E=8, NH=4, bias=False, batch_first=False, cross=True,
         mask="bool3", need_weights=False),
    dict(name="seq_first_bias_kv_self_padding_avg", E=8, NH=2, bias=True, batch_first=False, add_bias_kv=True,
         padding=True, need_weights=True, average=True),
    dict(name="seq_first_both_cross_bool3_padding_per_head", E=8, NH=2, bias=True, batch_first=False,
         add_bias_kv=True, add_zero_attn=True, cross=True, mask="bool3", padding=True, need_weights=True,
         average=False),
    dict(name="seq_first_zero_attn_self_float2_no_weights", E=12, NH=3, bias=False, batch_first=False,
         add_zero_attn=True, mask="float2", need_weights=False),
]
SDPA_CASES = [
    dict(name="gqa_causal_weights", NH=4, NKV=2, E=4, Ev=4, T=6, S=6, causal=True, need_weights=True),
    dict(name="mqa_bool_cross", NH=4, NKV=1, E=8, Ev=5, T=5, S=7, mask="bool4", need_weights=False),
    dict(name="gqa_float_padding_weights", NH=6, NKV=3, E=4, Ev=6, T=5, S=7, mask="float4", padding=True,
         need_weights=True),
    dict(name="gqa_causal_flash", NH=4, NKV=2, E=8, Ev=8, T=6, S=6, causal=True, need_weights=False),
]
ROPE_CASES = [
    dict(name="rope_gqa_causal_weights", E=16, NH=4, NKV=2, bias=True, causal=True, need_weights=True, average=False),
    dict(name="rope_mqa_no_weights", E=12, NH=2, NKV=1, bias=False, causal=True, need_weights=False),
]


def f32(t):
    """Rounded to float32, held in float64: exactly what tinygpt reads from the file."""
    return t.float().double()


def randn(gen, *shape, std=1.0):
    return f32(torch.randn(*shape, generator=gen, dtype=torch.float64) * std)


def padding_mask(gen, batch, keys):
    """(B, S) bool, true = ignore; never every key of a row (torch gives NaN there, tinygpt zeros)."""
    m = torch.rand(batch, keys, generator=gen) < 0.3
    m[:, 0] = False
    return m


def attn_mask(gen, kind, shape):
    """A bool mask (true = masked out, nn.MultiheadAttention's convention) leaving key 0 visible, or a float one."""
    if kind.startswith("bool"):
        m = torch.rand(*shape, generator=gen) < 0.35
        m[..., 0] = False
        return m
    return randn(gen, *shape)


def rope(x, positions, base=10000.0):
    """x (B, H, L, D): feature i rotated with feature i + D/2 by angle pos * base^(-2i/D)."""
    D = x.shape[-1]
    half = D // 2
    inv = base ** (-2.0 * torch.arange(half, dtype=torch.float64) / D)
    angle = positions.double()[:, None] * inv[None, :]  # (L, half)
    cos, sin = torch.cos(angle), torch.sin(angle)
    a, b = x[..., :half], x[..., half:]
    return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1)


def explicit_weights(q, k, scale, bias):
    """softmax(q k^T * scale + bias), the probabilities that F.scaled_dot_product_attention does not return."""
    return torch.softmax(q @ k.transpose(-2, -1) * scale + bias, dim=-1)


def mha_case(gen, c):
    E, NH = c["E"], c["NH"]
    kdim, vdim = c.get("kdim", E), c.get("vdim", E)
    batch_first = c.get("batch_first", True)
    extra_keys = c.get("add_bias_kv", False) or c.get("add_zero_attn", False)
    m = torch.nn.MultiheadAttention(E, NH, bias=c["bias"], kdim=kdim, vdim=vdim, batch_first=batch_first, dropout=0.0,
                                    add_bias_kv=c.get("add_bias_kv", False), add_zero_attn=c.get("add_zero_attn", False))
    m = m.double().train()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(randn(gen, *p.shape, std=0.5))
    # tinygpt's name -> (torch leaf, rows of it). One (3E, E) in_proj_weight is tinygpt's fused c_attn (q rows, then
    # k, then v); with kdim/vdim torch keeps separate q/k/v weights, and the biases are thirds of in_proj_bias.
    params = {}
    if m._qkv_same_embed_dim:
        params["c_attn.weight"] = (m.in_proj_weight, slice(None))
        if c["bias"]:
            params["c_attn.bias"] = (m.in_proj_bias, slice(None))
    else:
        for i, name in enumerate(("q_proj", "k_proj", "v_proj")):
            params[name + ".weight"] = (getattr(m, name + "_weight"), slice(None))
            if c["bias"]:
                params[name + ".bias"] = (m.in_proj_bias, slice(i * E, (i + 1) * E))
    params["c_proj.weight"] = (m.out_proj.weight, slice(None))
    if c["bias"]:
        params["c_proj.bias"] = (m.out_proj.bias, slice(None))
    if m.bias_k is not None:  # (1, 1, E) in torch and in tinygpt
        params["bias_k"] = (m.bias_k, slice(None))
        params["bias_v"] = (m.bias_v, slice(None))

    cross = c.get("cross", False)
    Sk = S if cross else T
    inputs = {}

    def seq(batch, length, features):  # the layout of the inputs (and the output): (B, L, F), or (L, B, F)
        return (batch, length, features) if batch_first else (length, batch, features)

    if cross:
        inputs["query"] = randn(gen, *seq(B, T, E)).requires_grad_()
        inputs["key"] = randn(gen, *seq(B, Sk, kdim)).requires_grad_()
        inputs["value"] = randn(gen, *seq(B, Sk, vdim)).requires_grad_()
        query, key, value = inputs["query"], inputs["key"], inputs["value"]
    else:
        inputs["x"] = randn(gen, *seq(B, T, E)).requires_grad_()
        query = key = value = inputs["x"]

    masks = {}
    kwargs = dict(need_weights=c["need_weights"], average_attn_weights=c.get("average", True))
    if c.get("padding"):
        masks["key_padding_mask"] = padding_mask(gen, B, Sk)
        kwargs["key_padding_mask"] = masks["key_padding_mask"]
    kind = c.get("mask")
    if kind:
        shape = (T, Sk) if kind.endswith("2") else (B * NH, T, Sk)
        masks["attn_mask"] = attn_mask(gen, kind, shape)
        kwargs["attn_mask"] = masks["attn_mask"]
    if c.get("causal"):  # torch takes is_causal as a hint and needs the mask itself
        causal = torch.triu(torch.ones(T, Sk, dtype=torch.bool), diagonal=1 + Sk - T)  # bottom-right, as tinygpt
        if extra_keys:
            # The mask, not the hint (module docstring): the user's mask (tinygpt gets it and is_causal) with the
            # causal positions hidden too.
            mask = masks.get("attn_mask")
            if mask is None:
                kwargs["attn_mask"] = causal
            elif mask.dtype == torch.bool:
                kwargs["attn_mask"] = mask | causal
            else:
                kwargs["attn_mask"] = mask.masked_fill(causal, float("-inf"))
        else:
            assert "attn_mask" not in masks, "causal with an attn_mask: torch would take the causal mask alone"
            kwargs["attn_mask"] = causal
            kwargs["is_causal"] = True
    out, weights = m(query, key, value, **kwargs)
    extra = dict(kdim=kdim, vdim=vdim, self=not cross, S=Sk)
    if extra_keys:
        extra["S_total"] = Sk + int(c.get("add_bias_kv", False)) + int(c.get("add_zero_attn", False))
        if weights is not None:
            assert weights.shape[-1] == extra["S_total"], weights.shape
    return params, inputs, masks, out, weights, extra


def sdpa_case(gen, c):
    NH, NKV, E, Ev, Tq, Sk = c["NH"], c["NKV"], c["E"], c["Ev"], c["T"], c["S"]
    G = NH // NKV
    inputs = {"q": randn(gen, B, NH, Tq, E).requires_grad_(), "k": randn(gen, B, NKV, Sk, E).requires_grad_(),
              "v": randn(gen, B, NKV, Sk, Ev).requires_grad_()}
    k = inputs["k"].repeat_interleave(G, dim=1)
    v = inputs["v"].repeat_interleave(G, dim=1)
    masks = {}
    bias = torch.zeros(B, NH, Tq, Sk, dtype=torch.float64)
    kind = c.get("mask")
    if kind:
        masks["attn_mask"] = attn_mask(gen, kind, (B, NH, Tq, Sk))
        m = masks["attn_mask"]
        bias = bias + (m.double().masked_fill(m, float("-inf")) if m.dtype == torch.bool else m)
    if c.get("padding"):
        masks["key_padding_mask"] = padding_mask(gen, B, Sk)
        bias = bias.masked_fill(masks["key_padding_mask"][:, None, None, :], float("-inf"))
    if c.get("causal"):
        bias = bias.masked_fill(torch.triu(torch.ones(Tq, Sk, dtype=torch.bool), diagonal=1), float("-inf"))
    if kind == "bool4" and not c.get("padding") and not c.get("causal"):
        # the functional convention: a bool mask says where to attend, the opposite of nn.MultiheadAttention's
        out = F.scaled_dot_product_attention(inputs["q"], k, v, attn_mask=~masks["attn_mask"])
    elif kind is None and not c.get("padding"):
        out = F.scaled_dot_product_attention(inputs["q"], k, v, is_causal=c.get("causal", False))
    else:
        out = F.scaled_dot_product_attention(inputs["q"], k, v, attn_mask=bias)
    weights = explicit_weights(inputs["q"], k, 1 / math.sqrt(E), bias)
    assert torch.allclose(weights @ v, out, atol=1e-12), "explicit weights disagree with F.scaled_dot_product_attention"
    return {}, inputs, masks, out, weights if c["need_weights"] else None, dict(T=Tq, S=Sk)


def rope_case(gen, c):
    E, NH, NKV = c["E"], c["NH"], c["NKV"]
    hd, G = E // NH, NH // NKV
    params = {"c_attn.weight": randn(gen, (NH + 2 * NKV) * hd, E, std=0.5), "c_proj.weight": randn(gen, E, E, std=0.5)}
    if c["bias"]:
        params["c_attn.bias"] = randn(gen, (NH + 2 * NKV) * hd, std=0.5)
        params["c_proj.bias"] = randn(gen, E, std=0.5)
    for p in params.values():
        p.requires_grad_()
    params = {name: (p, slice(None)) for name, p in params.items()}
    inputs = {"x": randn(gen, B, T, E).requires_grad_()}
    weight = {name: p for name, (p, _) in params.items()}
    qkv = F.linear(inputs["x"], weight["c_attn.weight"], weight.get("c_attn.bias"))
    q, k, v = qkv.split([NH * hd, NKV * hd, NKV * hd], dim=2)
    q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
    positions = torch.arange(T)
    q, k = rope(q, positions), rope(k, positions)
    k, v = k.repeat_interleave(G, dim=1), v.repeat_interleave(G, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=c["causal"])
    out = F.linear(y.transpose(1, 2).reshape(B, T, E), weight["c_proj.weight"], weight.get("c_proj.bias"))
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    weights = explicit_weights(q, k, 1 / math.sqrt(hd), torch.zeros(T, T, dtype=torch.float64).masked_fill(causal, float("-inf")))
    return params, inputs, {}, out, weights if c["need_weights"] else None, dict(self=True, S=T)



def main():
    gen = torch.Generator().manual_seed(4321 + SEED_OFFSET)
    extra_gen = torch.Generator().manual_seed(8765 + SEED_OFFSET)  # the extra mha cases: the earlier cases' numbers stay as they were
    tensors, cases = {}, []
    for kind, group, build, gen in (("mha", MHA_CASES, mha_case, gen), ("sdpa", SDPA_CASES, sdpa_case, gen),
                                    ("mha_rope", ROPE_CASES, rope_case, gen),
                                    ("mha", MHA_EXTRA_CASES, mha_case, extra_gen)):
        for c in group:
            params, inputs, masks, out, weights, extra = build(gen, c)
            dout = randn(gen, *out.shape)
            loss = (out * dout).sum()
            p = c["name"] + "."
            if weights is not None:
                dweights = randn(gen, *weights.shape)
                loss = loss + (weights * dweights).sum()
                tensors[p + "dweights"] = dweights.float()
                tensors[p + "expected.weights"] = weights.detach()
            loss.backward()
            named = {**params, **{name: (t, slice(None)) for name, t in inputs.items()}}
            for name, (t, rows) in named.items():
                tensors[p + name] = t.detach()[rows].float()
                tensors[p + "expected.grad." + name] = t.grad[rows]
            for name, t in masks.items():
                tensors[p + name] = t if t.dtype == torch.bool else t.float()
            tensors[p + "dout"] = dout.float()
            tensors[p + "expected.out"] = out.detach()
            meta = {k: v for k, v in c.items() if k != "name"}
            cases.append({"name": c["name"], "kind": kind, **meta, **extra})
    save_safetensors(OUT, tensors, {"cases": json.dumps(cases), "torch": torch.__version__, "B": str(B), "T": str(T)})
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(cases)} cases) with torch {torch.__version__}")


if __name__ == "__main__":
    main()
