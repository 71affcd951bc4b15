"""Checks `tinygpt import --format hf` with Hugging Face transformers: for a GPT2LMHeadModel made here with random
weights (a small one with random LayerNorm and bias parameters, and one of GPT-2 124M's shape and vocabulary size),
saved with save_pretrained beside a byte-level BPE tokenizer.json trained here with `tokenizers`, the imported run
encodes text to the tokenizer's ids, its logits agree with transformers' within 1e-4, and greedy decoding
(`tinygpt sample --temperature 0`) gives the bytes of transformers' generate(do_sample=False). Run by developers,
not by CI (it needs PyTorch and transformers, installed outside the source tree, and trains a 50,257-token
tokenizer, which takes minutes):

  python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers
  /tmp/venv-hf/bin/python tests/reference/check_hf_import.py [--build build] [--only small|124m] [--corpus DIR]... [--keep DIR]

The tokenizers are trained on --corpus (default /tmp/tok_corpus where it exists, else the text files of
/usr/share/doc, /usr/include, Python's standard library and Perl's). Where they give fewer than GPT-2's 50,257
tokens, the 124M model's vocabulary is the tokenizer's size instead (said in the output). The small model's
tokenizer.json has its <|endoftext|> first and the pre-tokenizer tinygpt's export writes (a Split of GPT-2's pattern,
then ByteLevel without regex); the 124M one is laid out as GPT-2's (<|endoftext|> last, a ByteLevel pre-tokenizer
with use_regex), and its weights are checked twice: as save_pretrained writes them, and as the Hub's
openai-community/gpt2 stores them (names without "transformer.", each layer's attn.bias causal mask stored).

tinygpt's logits come from tests/reference/logits/ (tinygpt_logits, as check_hf_export.py builds it), built against
the build's package installed into a temporary prefix. Exit status: 0 all checks pass, 1 a check fails or a tinygpt
command errs, 77 PyTorch, transformers or tokenizers is missing.
"""
import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

try:
    import numpy as np
    import safetensors.torch
    import tokenizers
    import torch
    import transformers
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoModelForCausalLM, AutoTokenizer, GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast
except ImportError as e:
    print(f"skipped: {e.name} is missing; install torch and transformers in a venv outside the source tree "
          f"(python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install torch transformers)")
    sys.exit(77)

transformers.utils.logging.disable_progress_bar()
transformers.utils.logging.set_verbosity_error()  # not its warnings of texts longer than the model's context
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from check_hf_export import ROOT, read_safetensors, run  # noqa: E402  (after the check that torch is there)

EOT = "<|endoftext|>"
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
TEXTS = [
    "Hello, world! It's a test of the tokenizer: 12345 + 678 = 13023.",
    "café, naïve, Ångström, déjà vu, Übergrößenträger, São Paulo, Ελληνικά, русский",
    "日本語のテキストと中文的文本，한국어 텍스트",
    "emoji 🎉🚀 done 👍🏽 family 👨‍👩‍👧 flags 🇫🇷",
    "  leading spaces,\ttabs\tand\n\nnewlines   \n  trailing ",
    "def f(x):\n    return x ** 2  # they'll've\n",
]
PROMPT = "The café said: 日本 🎉 it's"
NEW_TOKENS = 20


class Failed(Exception):
    pass


def tinygpt_bytes(*cmd):
    """stdout of a tinygpt command as bytes; Failed with its stderr when it errs."""
    r = subprocess.run([str(c) for c in cmd], capture_output=True)
    if r.returncode != 0:
        words = [str(c) for c in cmd[1:3] if not str(c).startswith("-")]
        raise Failed(f"`tinygpt {' '.join(words)}` exited {r.returncode}: {r.stderr.decode(errors='replace').strip()}")
    return r.stdout


def corpus_files(roots, max_bytes):
    """Text files under roots (sorted, valid UTF-8, no NUL), up to max_bytes in all."""
    files, total = [], 0
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                if not os.path.isfile(path) or os.path.islink(path) or name.endswith((".gz", ".bz2", ".xz", ".pyc")):
                    continue
                size = os.path.getsize(path)
                if size == 0 or size > 8 << 20:
                    continue
                files.append(path)
                total += size
                if total >= max_bytes:
                    return files
    return files


def read_texts(files):
    for path in files:
        try:
            data = pathlib.Path(path).read_bytes()
            if b"\0" in data:
                continue
            yield data.decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue


def train_tokenizer(files, vocab_size, eot_last):
    """A byte-level BPE of GPT-2's form with vocab_size tokens, or fewer where the corpus runs out of merges.
    eot_last: <|endoftext|> is the last id, as GPT-2's (trained to vocab_size - 1, then appended); else the trainer
    puts it first (id 0)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size - 1 if eot_last else vocab_size, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  special_tokens=[] if eot_last else [EOT])
    tok.train_from_iterator(read_texts(files), trainer)
    if eot_last:  # as GPT-2's tokenizer.json: in the model's vocab and an added special token, the last id
        j = json.loads(tok.to_str())
        eot_id = len(j["model"]["vocab"])
        j["model"]["vocab"][EOT] = eot_id
        j["added_tokens"] = [{"id": eot_id, "content": EOT, "single_word": False, "lstrip": False, "rstrip": False,
                              "normalized": False, "special": True}]
        tok = Tokenizer.from_str(json.dumps(j))
    return tok


def byte_decoder():
    """GPT-2's printable spelling of bytes, reversed: char -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def token_bytes(tok, ids):
    """The bytes the ids stand for (special tokens as their text): decode(skip_special_tokens=False), byte-exact
    where a token holds part of a UTF-8 character."""
    dec, special = byte_decoder(), {t.content for t in tok.get_added_tokens_decoder().values() if t.special}
    out = b""
    for i in ids:
        s = tok.id_to_token(i)
        out += s.encode() if s in special else bytes(dec[c] for c in s)
    return out


def write_hub_layout(src, dst, n_layer, n_positions):
    """model.safetensors as openai-community/gpt2 on the Hub holds it: the GPT2Model's names (no "transformer."
    prefix, no lm_head, which is tied) and each layer's attn.bias causal mask."""
    tensors = {k.removeprefix("transformer."): v for k, v in safetensors.torch.load_file(src).items()
               if k != "lm_head.weight"}
    mask = torch.tril(torch.ones(n_positions, n_positions)).view(1, 1, n_positions, n_positions)
    for i in range(n_layer):
        tensors[f"h.{i}.attn.bias"] = mask.clone()
    safetensors.torch.save_file(tensors, dst, metadata={"format": "pt"})


def make_model(shape, vocab_size, eot_id, randomize, seed):
    """A GPT2LMHeadModel with random weights (GPT-2's initialization; with randomize, weights 10 times larger, so
    greedy decoding does not repeat one token, and LayerNorm and bias parameters random too)."""
    config = GPT2Config(vocab_size=vocab_size, bos_token_id=eot_id, eos_token_id=eot_id,
                        initializer_range=0.2 if randomize else 0.02, **shape)
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config)
    if randomize:  # LayerNorm and bias parameters away from 1 and 0, so a swapped or dropped one shows
        with torch.no_grad():
            for name, p in model.named_parameters():
                if ".ln_" in name or name.startswith("transformer.ln_f"):
                    p.copy_((1 if name.endswith("weight") else 0) + 0.1 * torch.randn_like(p))
                elif name.endswith(".bias"):
                    p.copy_(0.1 * torch.randn_like(p))
    return model.eval()


def same_as_read(model, hf_dir):
    """transformers reads hf_dir as the model (the directory is a valid Hugging Face one)."""
    reread = AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    a, b = model.state_dict(), reread.state_dict()
    if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
        raise Failed(f"transformers does not read {hf_dir} as the model written (a bug of this script)")


class Checker:
    def __init__(self, build, tmp):
        self.tinygpt, self.tmp, self.build, self._logits_tool = build / "tinygpt", tmp, build, None

    def logits_tool(self):
        """tinygpt_logits built against the build's installed package, as check_hf_export.py builds it."""
        if self._logits_tool is None:
            prefix = self.tmp / "prefix"
            run("cmake", "--install", self.build, "--prefix", prefix)
            run("cmake", "-S", ROOT / "tests" / "reference" / "logits", "-B", self.tmp / "logits-build",
                f"-DCMAKE_PREFIX_PATH={prefix}", "-DCMAKE_BUILD_TYPE=Release")
            run("cmake", "--build", self.tmp / "logits-build")
            self._logits_tool = self.tmp / "logits-build" / "tinygpt_logits"
        return self._logits_tool

    def check(self, name, hf_dir, model):
        """Imports hf_dir and compares the run with model (and hf_dir's tokenizer); True when all agree."""
        run_dir = self.tmp / (name + "-run")
        shutil.rmtree(run_dir, ignore_errors=True)  # a run left by an earlier --keep
        try:
            tinygpt_bytes(self.tinygpt, "import", "--format", "hf", "--from", hf_dir, "--out", run_dir)
        except Failed as e:
            raise Failed(f"tinygpt import failed: {e}") from None
        ok = True

        # transformers reads the same directory (the check is of a valid Hugging Face model).
        hf_tok = AutoTokenizer.from_pretrained(hf_dir)
        for text in TEXTS:
            ours = [int(i) for i in tinygpt_bytes(self.tinygpt, "tokenizer", "encode", "--ckpt", run_dir,
                                                   "--text", text).split()]
            theirs = hf_tok(text).input_ids
            same = ours == theirs
            ok &= same
            print(f"{name:<12} ids {'same  ' if same else 'DIFFER'} ({len(theirs):>3} tokens) for {text[:40]!r}")
            if not same:
                print(f"             tinygpt:    {ours}\n             tokenizers: {theirs}")

        dump = self.tmp / (name + "-logits.safetensors")
        try:
            run(self.logits_tool(), run_dir, PROMPT, dump)
        except subprocess.CalledProcessError as e:
            said = (e.stderr.strip() + "\n" + e.stdout.strip()).strip()[-3000:]  # a compiler's errors: on stdout
            raise Failed(f"`{' '.join(map(str, e.cmd[:2]))}` failed (tinygpt_logits, from tests/reference/logits/): "
                         f"{said}") from None
        got = read_safetensors(dump)
        ids = torch.tensor([hf_tok(PROMPT).input_ids])
        with torch.no_grad():
            want = model(ids).logits.numpy()
        same_ids = got["ids"].tolist() == ids.tolist()
        diff = float(np.abs(want - got["logits"]).max()) if got["logits"].shape == want.shape else float("inf")
        ok &= same_ids and diff <= 1e-4
        print(f"{name:<12} logits: ids {'same' if same_ids else 'DIFFER'}, max |diff| {diff:.2e} "
              f"over {tuple(want.shape)} (|logits| up to {np.abs(want).max():.2f}) {'ok' if diff <= 1e-4 else 'FAIL'}")

        out = tinygpt_bytes(self.tinygpt, "sample", "--ckpt", run_dir, "--prompt", PROMPT, "--max-new-tokens",
                            NEW_TOKENS, "--temperature", 0, "--seed", 1)
        prompt = PROMPT.encode()
        ours = out[len(prompt):].removesuffix(b"\n") if out.startswith(prompt) and out.endswith(b"\n") else None
        with torch.no_grad():
            # eos_token_id None: 20 tokens whatever they are, as tinygpt samples (it does not stop at <|endoftext|>).
            gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=NEW_TOKENS,
                                 eos_token_id=None, pad_token_id=model.config.eos_token_id,
                                 return_dict_in_generate=True, output_scores=True)
        new_ids = gen.sequences[0, ids.shape[1]:].tolist()
        theirs = token_bytes(hf_tok.backend_tokenizer, new_ids)
        top2 = torch.stack([s[0].topk(2).values for s in gen.scores])
        margin = float((top2[:, 0] - top2[:, 1]).min())
        same = ours == theirs and len(new_ids) == NEW_TOKENS
        ok &= same
        print(f"{name:<12} greedy {NEW_TOKENS} tokens: {'same' if same else 'DIFFER'} "
              f"(smallest top-2 logit margin on the way {margin:.2e})")
        if not same:
            print(f"             tinygpt:      {out!r}")
        print(f"             transformers: {prompt + theirs!r}\n"
              f"             decoded:      {hf_tok.decode(gen.sequences[0], skip_special_tokens=False)!r}")
        return ok


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=str(ROOT / "build"), help="a configured and built tinygpt build directory")
    p.add_argument("--only", choices=["small", "124m"], help="check one model only")
    p.add_argument("--corpus", action="append", help="a directory of text files to train the tokenizers on "
                   "(repeatable; default /tmp/tok_corpus, else system text files)")
    p.add_argument("--keep", help="a directory to write the models and runs into and keep (default: a temporary one)")
    args = p.parse_args()
    build = pathlib.Path(args.build).resolve()
    if not (build / "tinygpt").exists():
        print(f"no {build / 'tinygpt'}: build tinygpt first, or give --build")
        sys.exit(1)
    roots = args.corpus or (["/tmp/tok_corpus"] if os.path.isdir("/tmp/tok_corpus") else
                            ["/usr/share/doc", "/usr/include", sysconfig.get_paths()["stdlib"], "/usr/share/perl"])
    print(f"transformers {transformers.__version__}, tokenizers {tokenizers.__version__}, torch {torch.__version__}, "
          f"{run(build / 'tinygpt', '--version').strip()}")

    with tempfile.TemporaryDirectory() as t:
        tmp = pathlib.Path(args.keep).resolve() if args.keep else pathlib.Path(t)
        tmp.mkdir(parents=True, exist_ok=True)
        checker, ok = Checker(build, tmp), True
        cases = [("small", dict(n_embd=64, n_layer=2, n_head=4, n_positions=64), 600, 8 << 20, False, True),
                 ("124m", dict(n_embd=768, n_layer=12, n_head=12, n_positions=1024), 50257, 128 << 20, True, False)]
        try:
            for name, shape, vocab, corpus_bytes, eot_last, randomize in cases:
                if args.only and args.only != name:
                    continue
                files = corpus_files(roots, corpus_bytes)
                t0 = time.monotonic()
                tok = train_tokenizer(files, vocab, eot_last)
                n = tok.get_vocab_size()
                print(f"{name:<12} tokenizer: {n} tokens from {len(files)} files "
                      f"({sum(os.path.getsize(f) for f in files) / 1e6:.0f} MB) in {time.monotonic() - t0:.1f}s"
                      + ("" if n == vocab else f"; fewer than {vocab}, so the model's vocabulary is {n}"))
                if not eot_last:  # the form tinygpt's export writes: GPT-2's pattern split, then bytes mapped
                    tok.pre_tokenizer = pre_tokenizers.Sequence([
                        pre_tokenizers.Split(Regex(GPT2_PATTERN), behavior="isolated", invert=False),
                        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
                model = make_model(shape, n, tok.token_to_id(EOT), randomize, seed=1234)
                hf_dir = tmp / (name + "-hf")
                model.save_pretrained(hf_dir, safe_serialization=True)
                PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOT, eos_token=EOT,
                                        unk_token=EOT).save_pretrained(hf_dir)
                same_as_read(model, hf_dir)
                ok &= checker.check(name, hf_dir, model)
                if name == "124m":  # the same model as the Hub's gpt2 lays out its weights
                    hub_dir = tmp / (name + "-hub-layout")
                    hub_dir.mkdir(exist_ok=True)
                    for f in hf_dir.iterdir():
                        if f.name != "model.safetensors":
                            (hub_dir / f.name).write_bytes(f.read_bytes())
                    write_hub_layout(hf_dir / "model.safetensors", hub_dir / "model.safetensors", shape["n_layer"],
                                     shape["n_positions"])
                    same_as_read(model, hub_dir)
                    ok &= checker.check(name + "-hub", hub_dir, model)
        except Failed as e:
            print(f"FAIL: {e}")
            sys.exit(1)
    print("import checked: tinygpt computes what transformers computes" if ok else "FAIL: the import differs")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
