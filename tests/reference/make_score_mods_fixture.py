"""Writes tests/reference/score_mods_fixture.safetensors: for a matrix of configurations of the attention score
modifiers (AttentionOptions::mods, kernels/score_mods.h), the inputs of scaled_dot_product_attention and what a
PyTorch reference written from the papers computes for them (output, and the gradient of q, k, v and of every learned
table), for test_score_mods_reference.cpp to check tinygpt against. Run by developers when the semantics of the
modifiers change (it needs PyTorch, installed outside the source tree); tests/torch_reference_test.sh also runs it live, into
a temporary file from other random numbers, when a torch is present:

  python3 -m venv /tmp/venv-torch && /tmp/venv-torch/bin/pip install torch numpy
  /tmp/venv-torch/bin/python tests/reference/make_score_mods_fixture.py

The reference, in plain torch ops and float64, none of it ported from tinygpt's C++:
  relative positions  Shaw et al. 2018, "Self-Attention with Relative Position Representations": learned tables
                      A_K (2m + 1, E) and A_V (2m + 1, Ev) shared by the heads, row clip(j - i, -m, m) + m for query
                      position i and key position j; e_ij = q_i . (k_j + A_K[row]) * scale and
                      out_i = sum_j p_ij (v_j + A_V[row]) (RelativeMultiHeadAttention, which gathers the (T, S, E)
                      tables: it is the reference, not a kernel).
  ALiBi               Press et al. 2022, "Train Short, Test Long": bias -slope_h |j - i| with the slopes of the paper's
                      get_slopes(n) for any head count.
  T5 bias             Raffel et al. 2020: a learned (NH, buckets) table indexed by Hugging Face's
                      _relative_position_bucket of j - i (half the buckets exact, the rest log-spaced up to
                      max_distance; causal = not bidirectional).
  window              key j visible iff |j - i| < W.
  documents           packed sequences: key visible iff its document id equals the query's.
  soft-capping        Gemma 2: cap * tanh(e / cap) on the scaled score, before the biases (ALiBi, T5, the additive
                      attn_mask) are added.
Query t sits at position t + S - T (bottom-right aligned, as the causal mask), key s at s; causal hides j > i.
Grouped-query heads: query head h reads key/value head h // (NH / NKV). key_padding_mask (B, S) bool, true = ignore.
A query that sees no key gives zeros (a safe softmax), as tinygpt documents.

Each case differentiates loss = sum(out * dout). Inputs and tables are rounded to float32 (what tinygpt computes in);
the reference runs in float64. Before saving, every case is also computed a second way (a per-query loop in numpy
with a scalar bucket function, its output and central-difference directional derivatives against the reference's
output and gradients) so the reference itself is checked.
"""
import json
import math
import pathlib
import sys

import numpy as np
import torch
import torch.nn as nn

from fixture_io import save_safetensors

# Arguments (tests/torch_reference_test.sh): an output path instead of the committed fixture, and a seed offset that
# draws other numbers for the same cases.
OUT = pathlib.Path(sys.argv[1]) if len(sys.argv) > 1 else pathlib.Path(__file__).with_name("score_mods_fixture.safetensors")
SEED_OFFSET = int(sys.argv[2]) if len(sys.argv) > 2 else 0
B = 2

# Every case: NH, NKV, T, S, E, Ev and any of causal, padding, max_rel (Shaw's m) with rel_key / rel_value, alibi,
# t5 (bucket count) with t5_max_distance and t5_bidirectional, window, docs ("shared": doc_ids only, T == S; "keys":
# doc_ids and key_doc_ids), softcap, attn_mask (an additive float (T, S) mask), empty_row (a query whose document no
# key has, so it sees no key).
BASE = dict(NH=4, NKV=2, T=7, S=7, E=6, Ev=5, causal=False, padding=False, max_rel=0, rel_key=False, rel_value=False,
            alibi=False, t5=0, t5_max_distance=128, t5_bidirectional=False, window=0, docs="", softcap=0.0,
            attn_mask=False, empty_row=False)
CASES = [
    dict(name="rel_key_clipped_causal", max_rel=2, rel_key=True, causal=True),                   # T > m: clipped
    dict(name="rel_key_unclipped", max_rel=9, rel_key=True),                                      # T < m: never
    dict(name="rel_key_value_causal_gqa_padding", max_rel=3, rel_key=True, rel_value=True, causal=True, T=5, S=9,
         padding=True),
    dict(name="rel_key_value_gqa_padding_t_gt_s", max_rel=2, rel_key=True, rel_value=True, NH=6, NKV=2, T=8, S=5,
         padding=True),
    dict(name="rel_value_only", max_rel=2, rel_value=True, causal=True, T=6, S=8),
    dict(name="alibi_4_heads_causal", alibi=True, causal=True),
    dict(name="alibi_6_heads_cross", alibi=True, NH=6, NKV=3, T=5, S=8),
    dict(name="t5_causal_8_12", t5=8, t5_max_distance=12, causal=True, NH=2, NKV=1, T=16, S=16, E=4, Ev=4),
    dict(name="t5_bidirectional_8_12", t5=8, t5_max_distance=12, t5_bidirectional=True, T=9, S=13),
    dict(name="t5_causal_32_128", t5=32, t5_max_distance=128, causal=True, NH=2, NKV=1, T=40, S=40, E=4, Ev=4),
    dict(name="t5_bidirectional_32_128", t5=32, t5_max_distance=128, t5_bidirectional=True, NH=2, NKV=1, T=40, S=40,
         E=4, Ev=4),
    dict(name="window_causal", window=3, causal=True, T=9, S=9),
    dict(name="window_bidirectional_cross", window=2, T=6, S=10),
    dict(name="documents_causal", docs="shared", causal=True, T=9, S=9),
    dict(name="documents_keys_padding_cross", docs="keys", padding=True, T=6, S=9),
    dict(name="softcap", softcap=1.5, causal=True),
    dict(name="softcap_then_mask_alibi", softcap=1.0, attn_mask=True, alibi=True, T=6, S=8),
    dict(name="everything", max_rel=2, rel_key=True, rel_value=True, alibi=True, t5=8, t5_max_distance=12,
         t5_bidirectional=True, window=5, docs="keys", empty_row=True, softcap=3.0, padding=True, attn_mask=True,
         causal=True, NH=4, NKV=1, T=9, S=11),
]


def f32(t):
    """Rounded to float32, held in float64: exactly what tinygpt reads from the file."""
    return t.float().double()


def randn(gen, *shape, std=1.0):
    return f32(torch.randn(*shape, generator=gen, dtype=torch.float64) * std)


# ---------------------------------------------------------------------------------------------------------------
# Positions and the modifiers, vectorized.

def distances(T, S):
    """(T, S) int64: key position minus query position, query t at t + S - T, key s at s."""
    return torch.arange(S)[None, :] - (torch.arange(T)[:, None] + S - T)


def get_slopes(n):
    """ALiBi's head slopes, as the paper's code (Press et al., github.com/ofirpress/attention_with_linear_biases)."""
    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio ** i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return get_slopes_power_of_2(closest_power_of_2) + get_slopes(2 * closest_power_of_2)[0::2][:n - closest_power_of_2]


def alibi_bias(NH, T, S):
    """(NH, T, S): -slope_h * |j - i|."""
    slopes = torch.tensor(get_slopes(NH), dtype=torch.float64)
    return -slopes[:, None, None] * distances(T, S).abs().double()[None]


def t5_relative_position_bucket(relative_position, bidirectional, num_buckets, max_distance):
    """T5's bucket of each relative position (key minus query), after Hugging Face's _relative_position_bucket: with
    bidirectional the buckets split in two, the second half for keys ahead of the query; otherwise keys ahead all
    land in bucket 0. Of a half, distances below half its buckets have a bucket each, the rest share log-spaced
    buckets up to max_distance (beyond it, the last). The log runs in float32 as Hugging Face's does."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets = buckets + (relative_position > 0).long() * num_buckets
        distance = relative_position.abs()
    else:
        distance = -torch.clamp(relative_position, max=0)
    max_exact = num_buckets // 2
    is_small = distance < max_exact
    scaled = torch.log(distance.float() / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    large = max_exact + scaled.to(torch.long)
    large = torch.minimum(large, torch.full_like(large, num_buckets - 1))
    return buckets + torch.where(is_small, distance, large)


def t5_bias(table, T, S, bidirectional, max_distance):
    """(NH, T, S): table[h, bucket(j - i)]."""
    bucket = t5_relative_position_bucket(distances(T, S), bidirectional, table.shape[1], max_distance)
    return table[:, bucket]


def visibility(c, T, S, padding, q_doc, k_doc):
    """(B, 1, T, S) bool: true where the query sees the key."""
    d = distances(T, S)
    seen = torch.ones(B, 1, T, S, dtype=torch.bool)
    if c["causal"]:
        seen = seen & (d <= 0)
    if c["window"] > 0:
        seen = seen & (d.abs() < c["window"])
    if padding is not None:
        seen = seen & ~padding[:, None, None, :]
    if q_doc is not None:
        seen = seen & (q_doc[:, None, :, None] == k_doc[:, None, None, :])
    return seen


def safe_softmax(scores, seen):
    """Softmax over the visible keys; a row that sees none is all zeros (and passes no gradient)."""
    z = torch.where(seen, scores, torch.full_like(scores, -math.inf))
    m = z.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m)).detach()
    e = torch.exp(z - m)
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))


class RelativeMultiHeadAttention(nn.Module):
    """Attention of already-projected heads with Shaw et al.'s relative position representations: the learned tables
    relative_key A_K (2m + 1, E) and relative_value A_V (2m + 1, Ev), shared by every head, either may be left out.
    e_ij = scale * q_i . (k_j + A_K[clip(j - i, -m, m) + m]), optionally soft-capped, plus the additive biases;
    out_i = sum_j p_ij (v_j + A_V[clip(j - i, -m, m) + m]) over the visible keys."""

    def __init__(self, max_rel, head_dim, value_dim, key=True, value=True, dtype=torch.float64):
        super().__init__()
        self.max_rel = max_rel
        rows = 2 * max_rel + 1
        self.relative_key = nn.Parameter(torch.zeros(rows, head_dim, dtype=dtype)) if key else None
        self.relative_value = nn.Parameter(torch.zeros(rows, value_dim, dtype=dtype)) if value else None

    def rows(self, T, S):
        """(T, S): the table row of each (query, key)."""
        m = self.max_rel
        return distances(T, S).clamp(-m, m) + m

    def forward(self, q, k, v, seen, bias=None, softcap=0.0, scale=None):
        """q (B, NH, T, E), k (B, NH, S, E), v (B, NH, S, Ev) (key/value heads already repeated per group),
        seen (B, 1|NH, T, S) bool, bias broadcastable to (B, NH, T, S) -> (B, NH, T, Ev)."""
        T, S, E = q.shape[2], k.shape[2], q.shape[3]
        scale = 1 / math.sqrt(E) if scale is None else scale
        scores = q @ k.transpose(-2, -1)
        if self.relative_key is not None:
            a_k = self.relative_key[self.rows(T, S)]  # (T, S, E)
            scores = scores + torch.einsum("bhte,tse->bhts", q, a_k)
        scores = scores * scale
        if softcap > 0:
            scores = softcap * torch.tanh(scores / softcap)
        if bias is not None:
            scores = scores + bias
        p = safe_softmax(scores, seen)
        out = p @ v
        if self.relative_value is not None:
            a_v = self.relative_value[self.rows(T, S)]  # (T, S, Ev)
            out = out + torch.einsum("bhts,tse->bhte", p, a_v)
        return out


def reference(c, values, masks, dtype=torch.float64):
    """The case's output from the vectorized reference, computed in `dtype` from `values` (q, k, v and the tables),
    and the leaves that hold each input's gradient after a backward: fresh leaves for q, k, v and the T5 table,
    the module's parameters for Shaw's tables."""
    NH, NKV, T, S = c["NH"], c["NKV"], c["T"], c["S"]
    G = NH // NKV
    attention = RelativeMultiHeadAttention(c["max_rel"], c["E"], c["Ev"], c["rel_key"], c["rel_value"], dtype)
    leaves = {}
    for name, t in values.items():
        if name in ("relative_key", "relative_value"):
            leaves[name] = getattr(attention, name)
            with torch.no_grad():
                leaves[name].copy_(t)
        else:
            leaves[name] = t.detach().to(dtype).requires_grad_()
    bias = torch.zeros(B, NH, T, S, dtype=torch.float64)
    if c["alibi"]:
        bias = bias + alibi_bias(NH, T, S)
    bias = bias.to(dtype)  # the fixed biases built in float64, then rounded as tinygpt adds them in its dtype
    if c["t5"]:
        bias = bias + t5_bias(leaves["t5_bias"], T, S, c["t5_bidirectional"], c["t5_max_distance"])
    if "attn_mask" in masks:
        bias = bias + masks["attn_mask"].to(dtype)
    seen = visibility(c, T, S, masks.get("key_padding_mask"), masks.get("doc_ids"),
                      masks.get("key_doc_ids", masks.get("doc_ids")))
    q, k, v = leaves["q"], leaves["k"].repeat_interleave(G, dim=1), leaves["v"].repeat_interleave(G, dim=1)
    out = attention(q, k, v, seen, bias, c["softcap"])
    return out, leaves


# ---------------------------------------------------------------------------------------------------------------
# The second way: one query at a time, numpy, a scalar bucket function.

def bucket_scalar(d, buckets, max_distance, bidirectional):
    ret = 0
    if bidirectional:
        buckets //= 2
        ret = buckets if d > 0 else 0
        n = abs(d)
    else:
        n = -d if d < 0 else 0
    exact = buckets // 2
    if n < exact:
        return ret + n
    x = np.log(np.float32(n) / np.float32(exact)) / np.float32(math.log(max_distance / exact))
    return ret + min(exact + int(x * np.float32(buckets - exact)), buckets - 1)


def loop_reference(c, arrays):
    """The output, one (batch, head, query) at a time."""
    NH, NKV, T, S, E, Ev = c["NH"], c["NKV"], c["T"], c["S"], c["E"], c["Ev"]
    q, k, v = arrays["q"], arrays["k"], arrays["v"]
    m = c["max_rel"]
    slopes = get_slopes(NH)
    out = np.zeros((B, NH, T, Ev))
    for b in range(B):
        for h in range(NH):
            g = h // (NH // NKV)
            for t in range(T):
                i = t + S - T
                logits, keys = [], []
                for j in range(S):
                    d = j - i
                    if c["causal"] and j > i:
                        continue
                    if c["window"] and abs(d) >= c["window"]:
                        continue
                    if "key_padding_mask" in arrays and arrays["key_padding_mask"][b, j]:
                        continue
                    if "doc_ids" in arrays:
                        key_docs = arrays.get("key_doc_ids", arrays["doc_ids"])
                        if arrays["doc_ids"][b, t] != key_docs[b, j]:
                            continue
                    row = min(max(d, -m), m) + m
                    key = k[b, g, j] + (arrays["relative_key"][row] if c["rel_key"] else 0)
                    x = float(q[b, h, t] @ key) / math.sqrt(E)
                    if c["softcap"]:
                        x = c["softcap"] * math.tanh(x / c["softcap"])
                    if c["alibi"]:
                        x -= slopes[h] * abs(d)
                    if c["t5"]:
                        x += arrays["t5_bias"][h, bucket_scalar(d, c["t5"], c["t5_max_distance"], c["t5_bidirectional"])]
                    if "attn_mask" in arrays:
                        x += arrays["attn_mask"][t, j]
                    logits.append(x)
                    keys.append((j, row))
                if not logits:
                    continue
                p = np.exp(np.array(logits) - max(logits))
                p /= p.sum()
                for w, (j, row) in zip(p, keys):
                    out[b, h, t] += w * (v[b, g, j] + (arrays["relative_value"][row] if c["rel_value"] else 0))
    return out


def check_second_way(c, values, masks, out, dout, grads, gen):
    """The loop's output equals the reference's, and its central differences along random directions equal the
    reference's gradients."""
    base = {name: t.numpy().copy() for name, t in values.items()}
    base.update({name: t.numpy() for name, t in masks.items()})
    dout_np = dout.numpy()
    got = loop_reference(c, base)
    err = np.abs(got - out.detach().numpy()).max()
    assert err < 1e-12, f"{c['name']}: loop output differs by {err}"
    eps = 1e-6
    for name in values:
        direction = torch.randn(*values[name].shape, generator=gen, dtype=torch.float64).numpy()
        plus, minus = dict(base), dict(base)
        plus[name] = base[name] + eps * direction
        minus[name] = base[name] - eps * direction
        numeric = ((loop_reference(c, plus) - loop_reference(c, minus)) * dout_np).sum() / (2 * eps)
        analytic = float((grads[name].numpy() * direction).sum())
        assert abs(numeric - analytic) <= 1e-6 * max(1.0, abs(analytic)), \
            f"{c['name']}: d/d{name} numeric {numeric} vs autograd {analytic}"


def float32_margin(c, values, masks, dout, expected):
    """The worst ratio to test_score_mods_reference.cpp's tolerance of the same reference run in float32: a proxy for
    the rounding that tinygpt's float32 kernels bring (printed, not asserted)."""
    out, leaves = reference(c, values, masks, torch.float32)
    (out * dout.float()).sum().backward()
    got = {"out": out.detach(), **{"grad." + name: t.grad for name, t in leaves.items()}}
    worst = 0.0
    for name, ref in expected.items():
        rtol, floor = (1e-5, 1e-5) if name == "out" else (1e-4, 1e-5)
        atol = floor * max(1.0, ref.abs().max().item())
        worst = max(worst, ((got[name].double() - ref).abs() / (atol + rtol * ref.abs())).max().item())
    return worst


# ---------------------------------------------------------------------------------------------------------------

def document_ids(c, gen):
    """(B, T) and (B, S) int32 document ids of packed sequences: batch 0 three documents, batch 1 two, split at random
    positions; keys by position (key s at s, query t at t + S - T). With empty_row one query of batch 1 gets a
    document no key has."""
    T, S = c["T"], c["S"]
    q_doc, k_doc = torch.zeros(B, T, dtype=torch.int32), torch.zeros(B, S, dtype=torch.int32)
    for b, count in enumerate((3, 2)):
        cuts = sorted(torch.randperm(S - 1, generator=gen)[:count - 1].add(1).tolist())
        doc_of = lambda position: sum(position >= cut for cut in cuts)
        for s in range(S):
            k_doc[b, s] = doc_of(s)
        for t in range(T):
            q_doc[b, t] = doc_of(t + S - T)
    if c["empty_row"]:
        q_doc[1, T // 2] = 7
    return q_doc, k_doc


def padding_mask(gen, c):
    """(B, S) bool, true = ignore, never the last key (so a causal query keeps its own position unless a document or
    window rule hides it)."""
    m = torch.rand(B, c["S"], generator=gen) < 0.3
    m[:, -1] = False
    return m


def build(c, gen):
    NH, NKV, T, S, E, Ev = c["NH"], c["NKV"], c["T"], c["S"], c["E"], c["Ev"]
    values = {"q": randn(gen, B, NH, T, E), "k": randn(gen, B, NKV, S, E), "v": randn(gen, B, NKV, S, Ev)}
    rows = 2 * c["max_rel"] + 1
    if c["rel_key"]:
        values["relative_key"] = randn(gen, rows, E, std=0.5)
    if c["rel_value"]:
        values["relative_value"] = randn(gen, rows, Ev, std=0.5)
    if c["t5"]:
        values["t5_bias"] = randn(gen, NH, c["t5"], std=0.5)
    masks = {}
    if c["padding"]:
        masks["key_padding_mask"] = padding_mask(gen, c)
    if c["docs"]:
        q_doc, k_doc = document_ids(c, gen)
        assert c["docs"] == "keys" or T == S
        masks["doc_ids"] = q_doc
        if c["docs"] == "keys":
            masks["key_doc_ids"] = k_doc
    if c["attn_mask"]:
        masks["attn_mask"] = randn(gen, T, S)
    return values, masks


def main():
    gen = torch.Generator().manual_seed(2018 + SEED_OFFSET)
    check_gen = torch.Generator().manual_seed(7 + SEED_OFFSET)
    # The bucket function against T5's known buckets (32 buckets, max distance 128).
    both = lambda d: t5_relative_position_bucket(torch.tensor([d]), True, 32, 128).item()
    causal = lambda d: t5_relative_position_bucket(torch.tensor([d]), False, 32, 128).item()
    assert [causal(d) for d in (0, 5, -1, -15, -16, -32, -64, -127, -100000)] == [0, 0, 1, 15, 16, 21, 26, 31, 31]
    assert [both(d) for d in (-3, 3, -16, 32, -1000)] == [3, 19, 10, 28, 15]
    d = torch.arange(-300, 300)
    for buckets, dist, bidir in ((8, 12, False), (8, 12, True), (32, 128, False), (32, 128, True)):
        vectorized = t5_relative_position_bucket(d, bidir, buckets, dist).tolist()
        assert vectorized == [bucket_scalar(x, buckets, dist, bidir) for x in d.tolist()]
    assert get_slopes(6) == [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125]

    tensors, cases = {}, []
    for spec in CASES:
        c = {**BASE, **spec}
        values, masks = build(c, gen)
        out, leaves = reference(c, values, masks)
        dout = randn(gen, *out.shape)
        (out * dout).sum().backward()
        grads = {name: t.grad.detach() for name, t in leaves.items()}
        check_second_way(c, values, masks, out, dout, grads, check_gen)
        expected = {"out": out.detach(), **{"grad." + n: g for n, g in grads.items()}}
        margin = float32_margin(c, values, masks, dout, expected)
        seen_none = 0
        p = c["name"] + "."
        for name, t in values.items():
            tensors[p + name] = t.float()
        for name, t in masks.items():
            tensors[p + name] = t.float() if t.is_floating_point() else t
        tensors[p + "dout"] = dout.float()
        tensors[p + "expected.out"] = out.detach()
        for name, g in grads.items():
            tensors[p + "expected.grad." + name] = g
        if c["empty_row"]:
            seen_none = int((out.detach().abs().sum(-1) == 0).sum())
            assert seen_none > 0
        cases.append(c)
        print(f"{c['name']:36s} checked two ways; float32 run at {margin:.3f} x the test's tolerance"
              + (f"; {seen_none} rows see no key" if seen_none else ""))
    save_safetensors(OUT, tensors, {"cases": json.dumps(cases), "torch": torch.__version__, "B": str(B)})
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes, {len(cases)} cases) with torch {torch.__version__}")


if __name__ == "__main__":
    main()
