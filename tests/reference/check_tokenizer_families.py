"""Checks tinygpt's byte-level BPE against Hugging Face `tokenizers` with each family's pre-split and special tokens.

A BPE trained by tinygpt on mixed text is given, in turn, the pre-tokenizers of GPT-2 (a Split of its pattern), Llama 3
(tiktoken's cl100k pattern: contractions in any case, digits in threes), Qwen2 (the same, digits one by one, and its
NFC normalizer) and
SmolLM2 (Digits, then ByteLevel's regex), the special tokens of those families (<|begin_of_text|>, <|im_start|>,
<|im_end|>, and an ordinary added token), and for Llama 3 its post-processor that puts <|begin_of_text|> first. On texts
chosen to reach every alternative of the patterns (contractions in capitals, number runs, whitespace before and after
newlines, punctuation followed by newlines, letters after a symbol, CJK, emoji, special tokens inside the text,
combining marks that NFC composes, reorders or leaves),
`tinygpt tokenizer encode --text` must give the ids of `Tokenizer.encode(text)`, and decode must give the text back.

  python3 tests/reference/check_tokenizer_families.py --tinygpt build/tinygpt

Exit status: 0 all pass, 1 a check fails, 77 `tokenizers` is missing.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import unicodedata

try:
    import tokenizers
except ImportError:
    print("check_tokenizer_families: SKIPPED: the tokenizers package is missing")
    sys.exit(77)

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
          r"|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

TEXTS = [
    "Hello world, it's a TEST: IT'S, they'RE, we'VE, I'M, you'LL, he'D, 'S alone.",
    "Numbers 1234567 and 12 and 9999999999; pi=3.14159, 1,000,000 and ٣٤٥ and ５６７.",
    "line one\nline two\n\n\nindented\n    four spaces\n\t\ttabs\r\nwindows\r\n\r\n  trailing  \n",
    "Symbols: (hello) [world] {x} <tag> #hash @at $5 %50 ^up &and *star ...\n!!!\n???\r\n;;",
    "  leading spaces, double  spaces,   triple   and a space before newline \n x",
    "Café naïve résumé — “quotes” ‘single’ … 中文文本 日本語のテキスト 한국어 😀👍🏽 🇫🇷",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n",
    "<|begin_of_text|>A text with its bos written out, and a <|im_end|><|im_end|> pair, <|im_start",
    "an ordinary added token: [MY_WORD] inside[MY_WORD]text and ]MY_WORD[ not",
    "def f(x):\n    return x ** 2  # square\n\nprint(f(3))\n",
    "'twas 'Tis O'Neil's rock'n'roll ''' '' ' and the long s: 'ſx 'ſ",
    "\u00a0non-breaking\u2003em space\u3000ideographic\u2028line sep",
    "Cafe\u0301 nai\u0308ve re\u0301sume\u0301: a\u0307\u0323 \u1100\u1161\u11a8 \u2126hm \u212b A\u030a\u0301 \u0958 "
    "\u0344 Vie\u0323\u0302t Nam \u304b\u3099 e\u0301\u0301",
]


def added(tid, content, special):
    return {"id": tid, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": not special, "special": special}


def family(base, name):
    """base (a tinygpt tokenizer.json, parsed) with the pre-tokenizer, added tokens and post-processor of `name`."""
    tok = json.loads(json.dumps(base))
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
    split = lambda pattern: {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": False}, byte_level]}
    tok["pre_tokenizer"] = {
        "gpt2": split(GPT2), "llama3": split(LLAMA3), "qwen2": split(QWEN2),
        "smollm2": {"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": True},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}]},
    }[name]
    if name == "qwen2":
        tok["normalizer"] = {"type": "NFC"}
    n = len(tok["model"]["vocab"])
    extra = [added(n, "<|begin_of_text|>", True), added(n + 1, "<|im_start|>", True), added(n + 2, "<|im_end|>", True),
             added(n + 3, "[MY_WORD]", False)]
    tok["added_tokens"] = tok["added_tokens"] + extra
    if name == "llama3":
        bos = {"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}
        tok["post_processor"] = {"type": "Sequence", "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {"type": "TemplateProcessing", "single": [bos, {"Sequence": {"id": "A", "type_id": 0}}],
             "pair": [bos, {"Sequence": {"id": "A", "type_id": 0}}, bos, {"Sequence": {"id": "B", "type_id": 1}}],
             "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [n],
                                                      "tokens": ["<|begin_of_text|>"]}}}]}
    return tok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tinygpt", required=True)
    args = ap.parse_args()
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        corpus = tmp / "corpus.txt"
        corpus.write_text("\n".join(TEXTS * 30), encoding="utf-8")
        subprocess.run([args.tinygpt, "tokenizer", "train", "--data", str(corpus), "--vocab-size", "700",
                        "--out", str(tmp / "base.json")], check=True, stderr=subprocess.DEVNULL)
        base = json.loads((tmp / "base.json").read_text(encoding="utf-8"))
        for name in ["gpt2", "llama3", "qwen2", "smollm2"]:
            path = tmp / f"{name}.json"
            path.write_text(json.dumps(family(base, name), ensure_ascii=False), encoding="utf-8")
            theirs = tokenizers.Tokenizer.from_file(str(path))
            same = 0
            for text in TEXTS:
                want = theirs.encode(text).ids
                run = subprocess.run([args.tinygpt, "tokenizer", "encode", "--tokenizer", str(path), "--text", text],
                                     capture_output=True, text=True)
                if run.returncode != 0:
                    print(f"{name}: tinygpt failed on {text!r}: {run.stderr.strip()}")
                    failures += 1
                    continue
                got = [int(x) for x in run.stdout.split()]
                back = subprocess.run([args.tinygpt, "tokenizer", "decode", "--tokenizer", str(path), "--ids",
                                       " ".join(map(str, got))], capture_output=True)
                # Decoding gives the text as the tokenizer saw it: Qwen2's normalized to NFC.
                seen = unicodedata.normalize("NFC", text) if name == "qwen2" else text
                ok_back = back.returncode == 0 and back.stdout.decode("utf-8") == ("<|begin_of_text|>" if name == "llama3" else "") + seen
                if got == want and ok_back:
                    same += 1
                    continue
                failures += 1
                if got != want:
                    first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
                    print(f"{name}: ids differ on {text!r} at {first}: tinygpt {got[first:first + 6]} "
                          f"({[theirs.id_to_token(i) for i in got[first:first + 6]]}), tokenizers "
                          f"{want[first:first + 6]} ({[theirs.id_to_token(i) for i in want[first:first + 6]]})")
                else:
                    print(f"{name}: decode does not give {text!r} back")
            print(f"{name:<8} pre-split, added tokens{' and bos' if name == 'llama3' else ''}: "
                  f"{same} of {len(TEXTS)} texts give tokenizers' ids and decode back")
    print("check_tokenizer_families:", "FAILED" if failures else "all pass")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
