"""Checks the Llama family against Hugging Face transformers, both ways.

Import: LlamaForCausalLM and Qwen2ForCausalLM made here with random weights (small configs with random RMSNorm gains
and, for Qwen2, random q/k/v biases; a small Llama with Llama 3's RoPE scaling, exported again and loaded back; and SmolLM2-135M's shape: 30 layers x 576, 9 heads, 3 key/value heads, MLP 1536,
rope theta 1e5, tied head, saved as bf16 shards; Llama and Qwen2 with heads of their own width, head_dim 24 and 32 of
a 64-wide model) beside a byte-level BPE that tinygpt trains here (GPT-2's pre-split;
for the SmolLM2 shape SmolLM2's pre-tokenizer, digits one by one, whose ids are first checked against tokenizers'),
imported by `tinygpt import --format hf`: the logits agree with transformers' (f32, on the same weights) within 1e-4
and greedy decoding (`tinygpt sample --temperature 0`) gives the text of generate(do_sample=False).

Export: a Llama-shaped model trained by tinygpt (`--arch llama`, grouped-query heads) and a Qwen2-shaped one
(`--qkv-bias`), and one with `--head-dim 24`, exported by `export --format hf`, load with AutoModelForCausalLM and compute tinygpt's logits and
greedy text; imported again, they give back the same tensors.

LoRA: adapters on every target of a Llama-shaped tinygpt model, exported merged by `export --format hf`: transformers'
logits and greedy text are those of `tinygpt sample` of the LoRA run (whose checkpoint holds only the adapters).

Run by developers, not by CI (it needs PyTorch and transformers, installed outside the source tree):

  python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers
  /tmp/venv-hf/bin/python tests/reference/check_hf_llama.py [--build build] [--only small|135m|export|lora|head_dim]

Exit status: 0 all checks pass, 1 a check fails or a tinygpt command errs, 77 PyTorch or transformers is missing.
"""
import json
import zlib
import pathlib
import subprocess
import sys
import tempfile

try:
    import numpy as np
    import tokenizers
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer
except ImportError as e:
    print(f"skipped: {e.name} is not installed (python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch "
          "transformers)")
    sys.exit(77)

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from check_hf_export import build_logits_tool, parse_args, read_safetensors, run  # noqa: E402
from check_hf_import import token_bytes  # noqa: E402

PROMPT = "ROMEO:\nWhat say you"
NEW_TOKENS = 32


def randomize_norms_and_biases(model, gen):
    """Random norm gains and biases (from_config leaves the gains at 1 and the biases at 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))


def compare(tinygpt, logits_tool, model, tokenizer, run_dir, tmp, name):
    """tinygpt's logits and greedy text of run_dir against transformers' model; True when both agree."""
    dump = tmp / f"{name}-logits.safetensors"
    run(logits_tool, run_dir, PROMPT, dump)
    ours = read_safetensors(dump)
    encoded = tokenizer(PROMPT, return_tensors="pt")
    same_ids = encoded.input_ids.tolist() == ours["ids"].tolist()
    with torch.no_grad():
        logits = model(encoded.input_ids).logits.float().numpy()
    diff = float(np.abs(logits - ours["logits"]).max())
    scale = float(np.abs(logits).max())
    ours_text = subprocess.run([str(tinygpt), "sample", "--ckpt", str(run_dir), "--prompt", PROMPT, "--temperature",
                                "0", "--max-new-tokens", str(NEW_TOKENS)], check=True,
                               capture_output=True).stdout.removesuffix(b"\n")
    with torch.no_grad():
        out = model.generate(**encoded, do_sample=False, max_new_tokens=NEW_TOKENS, pad_token_id=0)
    theirs_text = token_bytes(tokenizer.backend_tokenizer, out[0].tolist())  # random text need not be UTF-8
    same_text = ours_text == theirs_text
    print(f"{name:<14} {model.__class__.__name__:<17} ids {'same' if same_ids else 'DIFFER'}   max |logits diff| "
          f"{diff:.2e} (logits up to {scale:.1f})   greedy text {'same' if same_text else 'DIFFERS'}")
    if not same_text:
        print(f"               tinygpt:      {ours_text!r}\n               transformers: {theirs_text!r}")
    return same_ids and diff <= 1e-4 and same_text


DIGIT_TEXTS = ["In 2024, 3 cats ate 1,250 fish at 7:45pm.", "a  12 x3", "\u0663\u0664 and \uff11\uff12", "v1.2.3-rc4 x=42;"]


def check_digits_tokenizer(tinygpt, tok_dir, out_dir):
    """SmolLM2's pre-tokenizer (Digits with individual_digits, then ByteLevel's regex) on tinygpt's BPE: the ids of
    `tinygpt tokenizer encode` equal tokenizers' on texts with digits. Writes the tokenizer into out_dir."""
    tok = json.loads((tok_dir / "tokenizer.json").read_text())
    tok["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]}
    out_dir.mkdir()
    (out_dir / "tokenizer.json").write_text(json.dumps(tok))
    (out_dir / "tokenizer_config.json").write_text((tok_dir / "tokenizer_config.json").read_text())
    theirs = tokenizers.Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    ok = True
    for text in DIGIT_TEXTS:
        ours = [int(x) for x in run(tinygpt, "tokenizer", "encode", "--tokenizer", out_dir / "tokenizer.json",
                                    "--text", text).split()]
        ok = ok and ours == theirs.encode(text).ids
    print(f"{'digits':<14} Digits(individual_digits) + ByteLevel: ids {'same' if ok else 'DIFFER'} on "
          f"{len(DIGIT_TEXTS)} texts with digits")
    return ok


def check_import(tinygpt, tool, tok_dir, tmp, name, config_cls, model_cls, shape, bf16_shards):
    vocab = len(AutoTokenizer.from_pretrained(tok_dir))
    gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
    torch.manual_seed(zlib.crc32(name.encode()))
    config = config_cls(vocab_size=vocab, bos_token_id=0, eos_token_id=0, **shape)
    model = model_cls(config).eval()
    randomize_norms_and_biases(model, gen)
    hf_dir = tmp / f"{name}-hf"
    if bf16_shards:
        model.to(torch.bfloat16).save_pretrained(hf_dir, max_shard_size="100MB")
        model = model_cls.from_pretrained(hf_dir, dtype=torch.float32).eval()  # the bf16 weights, computed in f32
    else:
        model.save_pretrained(hf_dir)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    tokenizer.save_pretrained(hf_dir)
    shards = sorted(p.name for p in hf_dir.glob("*.safetensors"))
    run(tinygpt, "import", "--format", "hf", "--from", hf_dir, "--out", tmp / name)
    print(f"{name}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters, {len(shards)} weight file(s)")
    return compare(tinygpt, tool, model, tokenizer, tmp / name, tmp, name)


def check_scaled_round_trip(tinygpt, tool, tmp, name):
    """The imported run `name` exported again: transformers loads it with the same RoPE scaling and computes the same."""
    hf_dir = tmp / f"{name}-again"
    run(tinygpt, "export", "--ckpt", tmp / name, "--format", "hf", "--out", hf_dir)
    config = json.loads((hf_dir / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    print(f"{name + ' again':<14} exported: rope_scaling {config.get('rope_scaling')}")
    return compare(tinygpt, tool, model, AutoTokenizer.from_pretrained(hf_dir), tmp / name, tmp, f"{name}-again")


def check_export(tinygpt, tool, data, tok, tmp, name, flags):
    run_dir, hf_dir, back = tmp / name, tmp / f"{name}-hf", tmp / f"{name}-back"
    run(tinygpt, "train", "--data", data, "--tokenizer", tok, "--out", run_dir, "--n-layer", 2, "--n-head", 4,
        "--n-embd", 64, "--block-size", 64, "--batch-size", 8, "--max-iters", 300, "--lr-decay-iters", 300,
        "--eval-interval", 300, "--eval-iters", 2, *flags)
    run(tinygpt, "export", "--ckpt", run_dir, "--format", "hf", "--out", hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ok = compare(tinygpt, tool, model, AutoTokenizer.from_pretrained(hf_dir), run_dir, tmp, name)
    run(tinygpt, "import", "--format", "hf", "--from", hf_dir, "--out", back)
    a = read_safetensors(next(run_dir.glob("ckpt_best.safetensors")))
    b = read_safetensors(back / "ckpt_latest.safetensors")
    same = all(np.array_equal(a[k], b[k]) for k in b) and set(b) == {k for k in a if not k.startswith("optimizer.")}
    print(f"{name:<14} exported and imported again: {'the same tensors' if same else 'DIFFERENT tensors'}")
    return ok and same


def check_lora_export(tinygpt, tool, data, tok, tmp, name):
    """A LoRA run on a Llama-shaped base, exported merged: transformers computes what `sample` of the run does."""
    base, run_dir, hf_dir = tmp / f"{name}-base", tmp / name, tmp / f"{name}-hf"
    run(tinygpt, "train", "--data", data, "--tokenizer", tok, "--out", base, "--arch", "llama", "--n-kv-head", 2,
        "--n-layer", 2, "--n-head", 4, "--n-embd", 64, "--block-size", 64, "--batch-size", 8, "--max-iters", 200,
        "--lr-decay-iters", 200, "--eval-interval", 200, "--eval-iters", 2)
    other = tmp / f"{name}.txt"  # text of another kind, so the adapters have something to change
    other.write_text("ROMEO:\nWhat say you to the quick brown fox that jumps over the lazy dog?\n\n" * 400)
    run(tinygpt, "train", "--data", other, "--init-from", base, "--out", run_dir, "--lora-rank", 4, "--lora-targets",
        "q,k,v,o,gate,up,down", "--lr", 1e-2, "--max-iters", 100, "--lr-decay-iters", 100, "--warmup-iters", 10,
        "--eval-interval", 100, "--eval-iters", 2, "--batch-size", 8)
    run(tinygpt, "export", "--ckpt", run_dir, "--format", "hf", "--out", hf_dir)
    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    ok = compare(tinygpt, tool, model, AutoTokenizer.from_pretrained(hf_dir), run_dir, tmp, name)
    greedy = ["sample", "--prompt", PROMPT, "--temperature", 0, "--max-new-tokens", NEW_TOKENS, "--ckpt"]
    adapted = run(tinygpt, *greedy, run_dir) != run(tinygpt, *greedy, base)
    print(f"{name:<14} the adapters change the greedy text: {'yes' if adapted else 'NO (the base text)'}")
    return ok and adapted


def main():
    args, build = parse_args(__doc__, (["--only"], dict(choices=["small", "135m", "export", "lora", "head_dim"])))
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, "
          f"tinygpt {run(build / 'tinygpt', '--version').strip()}")
    L, Q = transformers.LlamaConfig, transformers.Qwen2Config
    LM, QM = transformers.LlamaForCausalLM, transformers.Qwen2ForCausalLM
    small = dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=1e5)
    smollm2 = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                   num_key_value_heads=3, max_position_embeddings=2048, rms_norm_eps=1e-5, rope_theta=1e5,
                   tie_word_embeddings=True)
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        tinygpt, tool = build_logits_tool(build, tmp)
        tok_dir = tmp / "tok"
        tok_dir.mkdir()
        run(tinygpt, "tokenizer", "train", "--data", args.data, "--vocab-size", 1024, "--out", tok_dir / "tokenizer.json")
        (tok_dir / "tokenizer_config.json").write_text('{"tokenizer_class": "PreTrainedTokenizerFast", '
                                                       '"clean_up_tokenization_spaces": false}\n')
        results = []
        if args.only in (None, "small"):
            results.append(check_import(tinygpt, tool, tok_dir, tmp, "llama-small", L, LM, dict(small), False))
            results.append(check_import(tinygpt, tool, tok_dir, tmp, "qwen2-small", Q, QM,
                                        dict(small, tie_word_embeddings=False), False))
            # Llama 3's RoPE scaling (rope_type llama3), its bands inside the small model's 8 pairs a head: an
            # original context of 32 keeps wavelengths under 8 and slows those over 32 by the factor.
            scaled = dict(small, rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                   high_freq_factor=4.0, original_max_position_embeddings=32))
            results.append(check_import(tinygpt, tool, tok_dir, tmp, "llama3-scaled", L, LM, scaled, False))
            results.append(check_scaled_round_trip(tinygpt, tool, tmp, "llama3-scaled"))
        if args.only in (None, "135m"):
            digits_dir = tmp / "tok-digits"
            results.append(check_digits_tokenizer(tinygpt, tok_dir, digits_dir))
            results.append(check_import(tinygpt, tool, digits_dir, tmp, "smollm2-135m", L, LM, smollm2, True))
        if args.only in (None, "export"):
            tok = tok_dir / "tokenizer.json"
            results.append(check_export(tinygpt, tool, args.data, tok, tmp, "llama-export",
                                        ["--arch", "llama", "--n-kv-head", 2, "--rope-theta", 1e5]))
            results.append(check_export(tinygpt, tool, args.data, tok, tmp, "qwen2-export",
                                        ["--arch", "llama", "--n-kv-head", 2, "--qkv-bias", "--untied-head"]))
        if args.only in (None, "head_dim"):  # heads not hidden_size / num_attention_heads wide (Qwen3's, Gemma's)
            results.append(check_import(tinygpt, tool, tok_dir, tmp, "llama-head32", L, LM, dict(small, head_dim=32),
                                        False))
            results.append(check_import(tinygpt, tool, tok_dir, tmp, "qwen2-head24", Q, QM,
                                        dict(small, head_dim=24, tie_word_embeddings=False), False))
            results.append(check_export(tinygpt, tool, args.data, tok_dir / "tokenizer.json", tmp, "head-dim-export",
                                        ["--arch", "llama", "--n-kv-head", 2, "--head-dim", 24]))
        if args.only in (None, "lora"):
            results.append(check_lora_export(tinygpt, tool, args.data, tok_dir / "tokenizer.json", tmp, "lora-export"))
    ok = all(results)
    print("the Llama family checked: transformers computes what tinygpt computes" if ok else "FAIL: a check differs")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
