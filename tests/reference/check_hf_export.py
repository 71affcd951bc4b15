"""Checks `tinygpt export --format hf` with Hugging Face transformers: for small models trained here (without and
with biases), the exported directory loads with AutoModelForCausalLM and AutoTokenizer, the tokenizer gives
tinygpt's ids, the logits agree with tinygpt's within 1e-4, and greedy decoding (generate, do_sample=False) gives
the text of `tinygpt sample --top-k 1`. Run by developers, not by CI (it needs PyTorch and transformers, installed
outside the source tree):

  python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers
  /tmp/venv-hf/bin/python tests/reference/check_hf_export.py [--build build] [--data ../shared/data/tinyshakespeare.txt]

tinygpt's logits come from tests/reference/logits/ (tinygpt_logits), built against the build's package installed
into a temporary prefix, as a user's program would be.
"""
import argparse
import json
import pathlib
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = "ROMEO:\nWhat"
NEW_TOKENS = 48


def run(*cmd, **kw):
    return subprocess.run([str(c) for c in cmd], check=True, text=True, capture_output=True, **kw).stdout


def parse_args(doc, *extra):
    """The reference scripts' common flags: --build (a built tinygpt build directory) and --data (the training text);
    `extra`: (flags, keyword arguments) pairs for add_argument. Returns the arguments and the resolved build path."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--build", default=str(ROOT / "build"), help="a configured and built tinygpt build directory")
    p.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "tinyshakespeare.txt"))
    for flags, kw in extra:
        p.add_argument(*flags, **kw)
    args = p.parse_args()
    return args, pathlib.Path(args.build).resolve()


def read_safetensors(path):
    data = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    types = {"F32": np.float32, "I32": np.int32}
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=types[info["dtype"]]).reshape(info["shape"])
    return out


def build_logits_tool(build, tmp):
    """The build's package installed into tmp/prefix, and tests/reference/logits built against it as a user's program
    would be: returns the installed tinygpt and tinygpt_logits."""
    run("cmake", "--install", build, "--prefix", tmp / "prefix")
    run("cmake", "-S", ROOT / "tests" / "reference" / "logits", "-B", tmp / "logits-build",
        f"-DCMAKE_PREFIX_PATH={tmp / 'prefix'}", "-DCMAKE_BUILD_TYPE=Release")
    run("cmake", "--build", tmp / "logits-build")
    return tmp / "prefix" / "bin" / "tinygpt", tmp / "logits-build" / "tinygpt_logits"


def check(tinygpt, logits_tool, data, tmp, name, flags):
    run_dir, hf_dir, dump = tmp / name, tmp / (name + "-hf"), tmp / (name + "-logits.safetensors")
    run(tinygpt, "train", "--data", data, "--out", run_dir, "--n-layer", 2, "--n-head", 4, "--n-embd", 64,
        "--block-size", 64, "--batch-size", 16, "--max-iters", 2000, "--lr-decay-iters", 2000, "--eval-interval", 2000,
        "--eval-iters", 5, *flags)
    run(tinygpt, "export", "--ckpt", run_dir, "--format", "hf", "--out", hf_dir)

    model = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(hf_dir)
    run(logits_tool, run_dir, PROMPT, dump)
    ours = read_safetensors(dump)
    encoded = tokenizer(PROMPT, return_tensors="pt")
    ids = encoded.input_ids
    same_ids = ids.tolist() == ours["ids"].tolist()
    with torch.no_grad():
        logits = model(ids).logits.numpy()
    diff = float(np.abs(logits - ours["logits"]).max())

    ours_text = run(tinygpt, "sample", "--ckpt", run_dir, "--prompt", PROMPT, "--top-k", 1,
                    "--max-new-tokens", NEW_TOKENS).removesuffix("\n")
    with torch.no_grad():
        # The attention mask given, as generate() would otherwise guess it from a pad token (there is none).
        out = model.generate(**encoded, do_sample=False, max_new_tokens=NEW_TOKENS)
    theirs_text = tokenizer.decode(out[0])
    same_text = ours_text == theirs_text
    print(f"{name:<8} {model.__class__.__name__:<16} ids {'same' if same_ids else 'DIFFER'}   "
          f"max |logits diff| {diff:.2e}   greedy text {'same' if same_text else 'DIFFERS'}")
    print(f"         tinygpt:      {ours_text!r}\n         transformers: {theirs_text!r}")
    return same_ids and diff <= 1e-4 and same_text


def main():
    args, build = parse_args(__doc__)
    print(f"transformers {transformers.__version__}, torch {torch.__version__}, tinygpt {run(build / 'tinygpt', '--version').strip()}")
    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(t)
        tinygpt, tool = build_logits_tool(build, tmp)
        ok = all([check(tinygpt, tool, args.data, tmp, "no-bias", []),
                  check(tinygpt, tool, args.data, tmp, "bias", ["--bias"])])
    print("export checked: transformers computes what tinygpt computes" if ok else "FAIL: the export differs")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
