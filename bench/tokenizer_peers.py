#!/usr/bin/env python3
"""Measure and check tinygpt's byte-level BPE tokenizer against its peers: Hugging Face tokenizers, tiktoken, rustbpe.

Run it with the python of the venv that bench/setup_tokenizer_venv.sh makes (it prints that python's path), on a corpus
that bench/make_text_corpus.sh makes:

    py=$(bash bench/setup_tokenizer_venv.sh | tail -n 1)
    bash bench/make_text_corpus.sh /tmp/tok_corpus 100

    # time the peers' training of a byte-level BPE of vocab N on every file of DIR (one document a file)
    $py bench/tokenizer_peers.py train --data /tmp/tok_corpus --vocab-size 32768 --threads 2 [--repeats 3] [--save tok.json]

    # time the peers' encoding of every file of DIR with the vocabulary of tok.json (Hugging Face format), and compare
    # their id stream with FILE (what tinygpt wrote: little-endian uint32, each document's ids then the end-of-text id)
    $py bench/tokenizer_peers.py encode --tokenizer tok.json --data /tmp/tok_corpus --ids FILE [--repeats 3]

    # interop: tinygpt's CLI `tokenizer encode` / `tokenizer decode` against both peers on tricky strings
    $py bench/tokenizer_peers.py check --tokenizer tok.json --tinygpt build/tinygpt

Conventions shared with the C++ side:
  * --vocab-size counts everything: the 256 byte tokens, the merges and the one special token "<|endoftext|>" (so
    N - 257 merges). rustbpe has no special tokens and counts 256 + merges, so it is asked for N - 1.
  * The documents of DIR are its files (symbolic links to files included, symbolically linked directories not
    entered), in the order of their paths relative to DIR sorted by bytes ('/' separated, like `LC_ALL=C sort`).
  * The Python peers take str, so each file is decoded as UTF-8 with errors="replace" (surrogateescape is no option:
    a lone surrogate cannot cross into Rust). tinygpt encodes the raw bytes, so the two agree only on files that are
    valid UTF-8; `encode` reports the others apart.
  * Split pattern: GPT-2's (GPT2_PATTERN below), which is what tokenizers' ByteLevel pre-tokenizer (use_regex=True)
    applies; tiktoken and rustbpe are given it explicitly. Its \p{L} and \p{N} are, in tiktoken 0.14.0 (Rust regex
    crate through fancy-regex) and tokenizers 0.23.3 (Oniguruma), exactly the general categories L* and N* of
    Unicode 16.0.0 (checked over every code point); its \s is the 25 White_Space code points in all of them.
  * Threads: RAYON_NUM_THREADS is set to --threads before tokenizers and rustbpe are imported (both use rayon), and
    tiktoken's batch encoding gets num_threads=--threads. The cpu/wall column shows what was used.
  * Timings exclude reading and decoding the files: the texts are loaded once, then each peer is timed on them.

Exit codes: 0 all agree (or the timing ran), 1 a mismatch, 2 a usage error, 77 (skip) when tokenizers or tiktoken is
not importable.
"""

import argparse
import bisect
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = "<|endoftext|>"
SKIP = 77


# ---------------------------------------------------------------------------------------------------------- helpers
def die(msg, code=2):
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(code)


def import_peers(need_rustbpe=False):
    """tokenizers and tiktoken (exit 77 without them), rustbpe when asked (None without it)."""
    try:
        import tiktoken
        import tokenizers
    except ImportError as e:
        print(f"skip: {e} (run it with the python that bench/setup_tokenizer_venv.sh prints)", file=sys.stderr)
        sys.exit(SKIP)
    rustbpe = None
    if need_rustbpe:
        try:
            import rustbpe
        except ImportError:
            print("note: rustbpe is not importable; that peer is skipped", file=sys.stderr)
    return tokenizers, tiktoken, rustbpe


def set_threads(n):
    old = os.environ.get("RAYON_NUM_THREADS")
    os.environ["RAYON_NUM_THREADS"] = str(n)
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    if "tokenizers" in sys.modules or "rustbpe" in sys.modules:
        die("RAYON_NUM_THREADS must be set before tokenizers or rustbpe is imported")
    note = f" (was {old})" if old is not None and old != str(n) else ""
    print(f"threads: RAYON_NUM_THREADS={n}{note} set before importing tokenizers/rustbpe; tiktoken num_threads={n}")


def os_threads():
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return -1


def list_documents(root):
    """Relative paths of the files under root, sorted by bytes; entries whose names start with '.' are skipped, as
    tinygpt's directory walk skips them."""
    if not os.path.isdir(root):
        die(f"{root} is not a directory")
    rels = []
    for d, dirs, names in os.walk(root, followlinks=False):
        dirs[:] = [x for x in dirs if not x.startswith(".")]
        for name in names:
            if name.startswith("."):
                continue
            path = os.path.join(d, name)
            if os.path.isfile(path):
                rels.append(os.path.relpath(path, root).replace(os.sep, "/"))
    rels.sort(key=os.fsencode)
    if not rels:
        die(f"{root} has no files")
    return rels


def load_documents(root):
    """(relative paths, raw bytes, texts decoded with errors='replace', indexes of the documents not valid UTF-8)."""
    rels = list_documents(root)
    raws, texts, invalid = [], [], []
    for i, rel in enumerate(rels):
        with open(os.path.join(root, rel), "rb") as f:
            raw = f.read()
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text = raw.decode("utf-8", errors="replace")
            invalid.append(i)
        raws.append(raw)
        texts.append(text)
    return rels, raws, texts, invalid


def timed(fn, repeats):
    """Runs fn repeats times: (last result, wall seconds of each run, cpu seconds of each run)."""
    walls, cpus, result = [], [], None
    for _ in range(repeats):
        result = None
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        result = fn()
        wall = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        walls.append(wall)
        cpus.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
    return result, walls, cpus


def print_table(rows, nbytes):
    """rows: (peer, detail, walls, cpus)."""
    mb = nbytes / 1e6
    print(f"\n{'peer':<34} {'detail':<22} {'min s':>8} {'median s':>9} {'max s':>8} {'MB/s':>8} {'cpu/wall':>8}")
    for peer, detail, walls, cpus in rows:
        med = statistics.median(walls)
        ratio = sum(cpus) / sum(walls) if sum(walls) > 0 else float("nan")
        print(f"{peer:<34} {detail:<22} {min(walls):8.2f} {med:9.2f} {max(walls):8.2f} {mb / med:8.2f} {ratio:8.2f}")
    print(f"(MB/s: {mb:.1f} MB of file bytes, 1 MB = 10^6 bytes, over the median; cpu/wall: process CPU time over "
          "wall time, about the number of busy threads)")


# --------------------------------------------------------------------------------------- tokenizer.json -> tiktoken
def bytes_to_unicode():
    """GPT-2's map from each byte to the printable character that stands for it in byte-level vocabularies."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


class HFVocab:
    """A Hugging Face byte-level BPE tokenizer.json, read as plain JSON: token bytes by id, merges, specials."""

    def __init__(self, path):
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except (OSError, ValueError) as e:
            die(f"cannot read {path}: {e}")
        model = doc.get("model") or {}
        if model.get("type") != "BPE":
            die(f"{path}: model.type is {model.get('type')!r}, not 'BPE'")
        self.warnings = []
        for key in ("dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix"):
            if model.get(key):
                self.warnings.append(f"model.{key} = {model[key]!r} (tiktoken has no such thing)")
        if model.get("byte_fallback"):
            self.warnings.append("model.byte_fallback is set")
        self.ignore_merges = bool(model.get("ignore_merges", False))
        pre = doc.get("pre_tokenizer") or {}
        if not (pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")):
            self.warnings.append(f"pre_tokenizer is {json.dumps(pre)[:200]}, not ByteLevel(use_regex=True, "
                                 "add_prefix_space=False): the GPT-2 pattern given to tiktoken may not match it")
        if doc.get("normalizer"):
            self.warnings.append(f"normalizer {json.dumps(doc['normalizer'])[:120]} is set (tiktoken has none)")

        self.special = {t["content"]: t["id"] for t in doc.get("added_tokens", [])}
        special_ids = set(self.special.values())
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        self.token_bytes = {}  # id -> bytes, every non-special id
        for token, i in model["vocab"].items():
            if i in special_ids or token in self.special:
                continue
            try:
                self.token_bytes[i] = bytes(byte_of[c] for c in token)
            except KeyError as e:
                die(f"{path}: vocabulary entry {token!r} (id {i}) has a character {e} outside GPT-2's byte map")
        if len(set(self.token_bytes.values())) != len(self.token_bytes):
            die(f"{path}: two ids have the same bytes")
        have = set(self.token_bytes.values())
        missing = [b for b in range(256) if bytes([b]) not in have]
        if missing:
            die(f"{path}: {len(missing)} single bytes have no token (first: {missing[:8]}); a byte-level BPE needs all 256")
        self.merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model.get("merges", [])]
        # tiktoken merges in the order of the ids of the merged tokens; that equals tokenizers' order of the merges
        # list only when each merge's result has a larger id than the one before.
        ids = [model["vocab"].get(a + b) for a, b in self.merges]
        if None in ids:
            self.warnings.append("a merge's result is not in the vocabulary")
        elif any(x >= y for x, y in zip(ids, ids[1:])):
            self.warnings.append("the ids of the merges' results do not grow with the merges' order: tiktoken's ranks "
                                 "(the ids) then apply merges in another order than tokenizers does")
        self.eot = self.special.get(EOT)
        self.n_vocab = len(model["vocab"]) + len([t for t in self.special if t not in model["vocab"]])

    def tiktoken_encoding(self, tiktoken, name="tinygpt-bpe"):
        return tiktoken.Encoding(name, pat_str=GPT2_PATTERN,
                                 mergeable_ranks={b: i for i, b in self.token_bytes.items()},
                                 special_tokens=dict(self.special))

    def describe(self):
        return (f"{self.n_vocab} tokens: {len(self.token_bytes)} byte/merged + {len(self.special)} special "
                f"({', '.join(f'{t}={i}' for t, i in self.special.items()) or 'none'}), {len(self.merges)} merges, "
                f"ignore_merges={self.ignore_merges}")

    def show(self, ids):
        """ids rendered as id:bytes pairs."""
        inverse = {i: t for t, i in self.special.items()}
        out = []
        for i in ids:
            i = int(i)
            out.append(f"{i}:{inverse[i]}" if i in inverse else f"{i}:{self.token_bytes.get(i, b'?')!r}")
        return " ".join(out)


# ---------------------------------------------------------------------------------------------------------- train
def cmd_train(args):
    set_threads(args.threads)
    tokenizers, _, rustbpe = import_peers(need_rustbpe=True)
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rels, raws, texts, invalid = load_documents(args.data)
    nbytes = sum(len(r) for r in raws)
    print(f"data: {args.data}: {len(rels)} documents (one a file), {nbytes} bytes, {len(invalid)} not valid UTF-8 "
          "(decoded with errors='replace')")
    print(f"vocab size {args.vocab_size}: 256 bytes + {args.vocab_size - 257} merges + {EOT}")
    if args.vocab_size <= 257:
        die("--vocab-size must be over 257")
    base_threads = os_threads()
    rows = []

    def hf_train():
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(iter(texts), trainer=trainer, length=len(texts))
        return tok

    hf, walls, cpus = timed(hf_train, args.repeats)
    hf_vocab = hf.get_vocab_size()
    rows.append((f"tokenizers {tokenizers.__version__}", f"vocab {hf_vocab}", walls, cpus))
    print(f"tokenizers: done, vocab {hf_vocab}; OS threads of this process {base_threads} -> {os_threads()} "
          f"(its rayon pool; want +{args.threads})")
    if args.save:
        hf.save(args.save)
        print(f"saved the tokenizers vocabulary to {args.save}")

    rb = None
    if rustbpe is not None:
        def rb_train():
            tok = rustbpe.Tokenizer()
            tok.train_from_iterator(iter(texts), vocab_size=args.vocab_size - 1, pattern=GPT2_PATTERN)
            return tok

        before = os_threads()
        rb, walls, cpus = timed(rb_train, args.repeats)
        version = getattr(rustbpe, "__version__", None) or _dist_version("rustbpe")
        rows.append((f"rustbpe {version}", f"vocab {rb.vocab_size}+0 special", walls, cpus))
        print(f"rustbpe: done, vocab {rb.vocab_size} (no special token); OS threads of this process {before} -> "
              f"{os_threads()} (its own rayon pool; want +{args.threads})")
    print_table(rows, nbytes)

    if rb is not None:
        # Same corpus, same pattern, same number of merges: how alike are the two vocabularies?
        byte_of = {c: b for b, c in bytes_to_unicode().items()}
        hf_tokens = sorted(((i, bytes(byte_of[c] for c in t)) for t, i in hf.get_vocab().items() if t != EOT))
        hf_merged = [b for _, b in hf_tokens if len(b) > 1]
        rb_merged = [b for b, _ in sorted(((bytes(k), v) for k, v in rb.get_mergeable_ranks()), key=lambda kv: kv[1])
                     if len(b) > 1]
        same_prefix = next((k for k, (x, y) in enumerate(zip(hf_merged, rb_merged)) if x != y),
                           min(len(hf_merged), len(rb_merged)))
        common = len(set(hf_merged) & set(rb_merged))
        print(f"\nvocabularies: tokenizers {len(hf_merged)} merged tokens, rustbpe {len(rb_merged)}; the first "
              f"{same_prefix} are the same in the same order, {common} are in both")
        if same_prefix < min(len(hf_merged), len(rb_merged)):
            print(f"  first difference at merge {same_prefix}: tokenizers {hf_merged[same_prefix]!r}, "
                  f"rustbpe {rb_merged[same_prefix]!r} (ties between equal counts may be broken differently)")
    return 0


def _dist_version(name):
    try:
        from importlib.metadata import version
        return version(name)
    except Exception:
        return "?"


# ---------------------------------------------------------------------------------------------------------- encode
def cmd_encode(args):
    set_threads(args.threads)
    tokenizers, tiktoken, _ = import_peers()
    import numpy as np
    from tokenizers import Tokenizer

    vocab = HFVocab(args.tokenizer)
    print(f"tokenizer: {args.tokenizer}: {vocab.describe()}")
    for w in vocab.warnings:
        print(f"warning: {w}")
    if vocab.eot is None:
        die(f"{args.tokenizer} has no {EOT} token")
    enc = vocab.tiktoken_encoding(tiktoken)
    hf = Tokenizer.from_file(args.tokenizer)

    rels, raws, texts, invalid = load_documents(args.data)
    nbytes = sum(len(r) for r in raws)
    print(f"data: {args.data}: {len(rels)} documents, {nbytes} bytes, {len(invalid)} not valid UTF-8 (the peers see "
          "them decoded with errors='replace', tinygpt sees the bytes: expect those to differ)")

    def stream(per_doc):
        out = []
        for ids in per_doc:
            out.extend(ids)
            out.append(vocab.eot)
        return np.asarray(out, dtype=np.uint32)

    rows = []
    tk_docs, walls, cpus = timed(lambda: enc.encode_ordinary_batch(texts, num_threads=args.threads), args.repeats)
    rows.append((f"tiktoken {tiktoken.__version__}", "encode_ordinary_batch", walls, cpus))
    fast = hasattr(hf, "encode_batch_fast")
    hf_call = hf.encode_batch_fast if fast else hf.encode_batch
    hf_enc, walls, cpus = timed(lambda: hf_call(texts, add_special_tokens=False), args.repeats)
    hf_docs = [e.ids for e in hf_enc]
    rows.append((f"tokenizers {tokenizers.__version__}", "encode_batch_fast" if fast else "encode_batch", walls, cpus))
    print_table(rows, nbytes)

    tk_stream = stream(tk_docs)
    ntok = len(tk_stream) - len(texts)
    print(f"\ntiktoken: {ntok} tokens ({nbytes / max(ntok, 1):.3f} bytes a token) + {len(texts)} end-of-text")
    ok = True
    peer_diff = [i for i, (a, b) in enumerate(zip(tk_docs, hf_docs)) if a != b]
    if peer_diff:
        print(f"tiktoken and tokenizers disagree on {len(peer_diff)} documents (first: {rels[peer_diff[0]]})")
        show_first_difference(vocab, tk_docs[peer_diff[0]], hf_docs[peer_diff[0]], "tiktoken", "tokenizers")
    else:
        print("tiktoken and tokenizers agree on every document")

    try:
        theirs = np.fromfile(args.ids, dtype="<u4")
    except OSError as e:
        die(f"cannot read {args.ids}: {e}")
    for name, docs in (("tiktoken", tk_docs), ("tokenizers", hf_docs)):
        ok &= compare_stream(vocab, rels, invalid, docs, stream(docs), theirs, name, args.ids)
    return 0 if ok else 1


def compare_stream(vocab, rels, invalid, docs, ours, theirs, name, path):
    """Prints how the id stream in path compares with a peer's; True when identical on every valid UTF-8 document."""
    import numpy as np

    print(f"\n{path} ({len(theirs)} ids) against {name} ({len(ours)} ids):")
    n = min(len(ours), len(theirs))
    diff = np.flatnonzero(ours[:n] != theirs[:n]) if n else []
    identical = len(ours) == len(theirs) and len(diff) == 0
    print(f"  ids identical: {'yes' if identical else 'no'}")
    if identical:
        return True
    first = int(diff[0]) if len(diff) else n
    ends = np.cumsum([len(d) + 1 for d in docs])  # stream position just past each document's end-of-text id
    d = min(bisect.bisect_right(ends, first), len(docs) - 1)
    start = int(ends[d - 1]) if d else 0
    print(f"  first difference at position {first}: document {d} ({rels[d]}{', not valid UTF-8' if d in invalid else ''})"
          f", its token {first - start} (from 0)")
    lo, hi = max(first - 4, 0), first + 5
    print(f"    {name:<10}: {vocab.show(ours[lo:hi])}")
    print(f"    {'file':<10}: {vocab.show(theirs[lo:hi])}")
    # Split the file at its end-of-text ids to tell how many documents differ, when it splits into as many.
    cuts = np.flatnonzero(theirs == vocab.eot)
    if len(cuts) == len(docs) and (len(theirs) == 0 or cuts[-1] == len(theirs) - 1):
        pieces = np.split(theirs, cuts + 1)[:-1]
        bad = [i for i, (p, dd) in enumerate(zip(pieces, docs)) if list(p[:-1]) != list(dd)]
        bad_valid = [i for i in bad if i not in set(invalid)]
        print(f"  documents that differ: {len(bad)}, {len(bad) - len(bad_valid)} of them not valid UTF-8 (expected); "
              f"valid UTF-8 documents that differ: {len(bad_valid)}")
        for i in bad_valid[:5]:
            print(f"    {rels[i]}")
        if bad_valid and bad_valid[0] != d:
            i = bad_valid[0]
            print(f"  first difference in a valid UTF-8 document, {rels[i]}:")
            show_first_difference(vocab, docs[i], list(pieces[i][:-1]), name, "file")
        return not bad_valid
    print(f"  the file has {len(cuts)} end-of-text ids for {len(docs)} documents, so it cannot be split per document")
    return False


def show_first_difference(vocab, a, b, name_a, name_b):
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    lo, hi = max(k - 3, 0), k + 4
    print(f"    at its token {k} (from 0), showing tokens {lo} to {hi - 1}:")
    print(f"    {name_a:<10}: {vocab.show(a[lo:hi])}")
    print(f"    {name_b:<10}: {vocab.show(b[lo:hi])}")


# ---------------------------------------------------------------------------------------------------------- check
def tricky_strings():
    """(label, text) pairs; no NUL (a command-line argument cannot hold one)."""
    cases = [
        ("ascii", "Hello, world! This is a test."),
        ("accents precomposed", "café naïve résumé Ångström Øre façade"),
        ("combining marks", "cafe\u0301 nai\u0308ve A\u030angstro\u0308m e\u0301\u0301\u0301 Z\u0335\u0328a\u0336lgo"),
        ("CJK", "日本語のテキスト、中文文本。한국어 텍스트"),
        ("CJK with ascii", "GPT模型 uses 2048个token。"),
        ("emoji", "I ❤️ 🍕 and 🚀🚀🚀!"),
        ("emoji ZWJ family", "👨‍👩‍👧‍👦 👩🏽‍💻 🏳️‍🌈"),
        ("emoji skin tones", "👍🏻👍🏼👍🏽👍🏾👍🏿"),
        ("flags", "🇫🇷🇩🇪🇯🇵🇺🇸 🏴󠁧󠁢󠁳󠁣󠁴󠁿"),
        ("control chars", "a\x01b\x02c\x1bd\x7fe\x0bf\x0cg"),
        ("tabs", "\tindented\n\t\tdouble\tinner\t\t"),
        ("CRLF", "line one\r\nline two\r\n\r\nline four\r\n"),
        ("lone CR", "a\rb\r\rc"),
        ("spaces before words", "a  b   c    d     e      f"),
        ("trailing spaces", "word   "),
        ("leading spaces", "   word"),
        ("contractions", "it's don't they're we've I'm you'll he'd"),
        ("contractions upper", "IT'S DON'T THEY'RE WE'VE I'M YOU'LL HE'D"),
        ("contractions mixed", "It'S don'T We'Ll you'LL 'll 'LL"),
        ("contractions curly", "it’s don’t"),
        ("digit runs", "1 12 123 1234 12345 123456789012345678901234567890"),
        ("numbers", "3.14159 -42 1e-10 0x1F 1,000,000 ½ ² ٣٤٥ ๑๒๓"),
        ("mixed scripts", "Ελληνικά Русский עברית العربية हिन्दी ไทย ქართული"),
        ("RTL marks", "abc\u200fdef\u200e\u202eghi\u202c"),
        ("zero width", "a\u200bb\u200cc\u200dd\ufeffe\u2060f"),
        ("NBSP", "a\u00a0b \u00a0c\u00a0\u00a0d"),
        ("ideographic space", "日本\u3000語\u3000\u3000x"),
        ("other spaces", "a\u2000b\u2003c\u2009d\u202fe\u205ff\u1680g\u0085h\u2028i\u2029j"),
        ("space", " "),
        ("two spaces", "  "),
        ("newlines", "\n\n\n"),
        ("space newline", " \n \n"),
        ("newline spaces word", "\n   word"),
        ("empty", ""),
        ("single letter", "a"),
        ("punctuation runs", "!!!??? ... --- ___ *** ### ```python\n"),
        ("code", "def f(x):\n    return x**2  # square\n\nif __name__ == '__main__':\n\tprint(f(3))\n"),
        ("C code", "int main(void) {\n  printf(\"%d\\n\", a[i++]);\n  return 0;\n}\n"),
        ("json", '{"key": [1, 2.5, null, true], "s": "x\\u00e9"}'),
        ("url", "https://example.com/path?q=1&r=%20x#frag"),
        ("math symbols", "∀x∈ℝ: x² ≥ 0 ∑∫∂√∞ ≈ ≠"),
        ("old italic / supplementary", "𐌀𐌁𐌂 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝟘𝟙𝟚"),
        ("private use and noncharacters", "\ue000\uf8ff\U000f0000\U0010fffd\ufffe\uffff\U0010ffff"),
        ("replacement char", "a\ufffdb"),
        # The peers' \p{L} and \p{N} are exactly Unicode 16.0's L* and N* (tiktoken 0.14's regex crate, tokenizers
        # 0.23's Oniguruma): letters and digits new in 15.0 to 16.0 are letters and digits to them ...
        ("letters/digits new in Unicode 15.0-16.0",
         "x\U00011f04y \U0001e4d0\U00031350 \U0002ebf0 \U00010d50z \U000105c0 1\U00011f50 2\U00010d40 3"),
        # ... and those of 17.0 are not (they fall in [^\s\p{L}\p{N}]).
        ("letters new in Unicode 17.0", "x\U00010940y \U000323b0\U000323b1 a\U00016ea0 b\U00011db0c"),
        ("BOM start", "\ufeffhello"),
        ("apostrophe s after space", " 's 't"),
        ("starts with dashes", "--help -x --"),
        ("repeated letter", "a" * 500),
        ("repeated space", " " * 300 + "x"),
    ]
    rng = random.Random(20240607)

    def scalar(bmp_only):
        while True:
            c = rng.randrange(0x1, 0x10000 if bmp_only else 0x110000)
            if not 0xD800 <= c <= 0xDFFF:
                return chr(c)

    cases.append(("random over all planes", "".join(scalar(False) for _ in range(600))))
    cases.append(("random BMP", "".join(scalar(True) for _ in range(600))))
    mix = "".join(rng.choice(["a", "b", " ", "  ", "\n", "'", "s", "1", "é", "日", "🙂", "\t", "\u00a0", "."])
                  for _ in range(800))
    cases.append(("random mix of the above", mix))
    return cases


def run_cli(binary, args):
    try:
        p = subprocess.run([binary, "tokenizer", *args], capture_output=True, timeout=60)
    except OSError as e:
        return None, f"cannot run {binary}: {e}"
    except subprocess.TimeoutExpired:
        return None, "timed out after 60 s"
    if p.returncode != 0:
        return None, f"exit {p.returncode}: {p.stderr.decode('utf-8', 'replace').strip()[:300]}"
    return p.stdout, None


def cmd_check(args):
    _, tiktoken, _ = import_peers()
    from tokenizers import Tokenizer

    if not (os.path.isfile(args.tinygpt) and os.access(args.tinygpt, os.X_OK)):
        die(f"{args.tinygpt} is not an executable file")
    vocab = HFVocab(args.tokenizer)
    print(f"tokenizer: {args.tokenizer}: {vocab.describe()}")
    for w in vocab.warnings:
        print(f"warning: {w}")
    enc = vocab.tiktoken_encoding(tiktoken)
    hf = Tokenizer.from_file(args.tokenizer)
    peers = {"tokenizers": lambda t: hf.encode(t, add_special_tokens=False).ids, "tiktoken": enc.encode_ordinary}
    if args.against != "both":
        peers = {args.against: peers[args.against]}

    failures, decode_endings = 0, {}
    cases = tricky_strings()
    for label, text in cases:
        problems = []
        out, err = run_cli(args.tinygpt, ["encode", "--tokenizer", args.tokenizer, "--text", text])
        ids = None
        if err:
            problems.append(f"encode: {err}")
        else:
            try:
                ids = [int(x) for x in out.decode("ascii").split()]
            except (UnicodeDecodeError, ValueError):
                problems.append(f"encode printed something that is not ids: {out[:200]!r}")
        if ids is not None:
            for name, fn in peers.items():
                want = fn(text)
                if ids != want:
                    k = next((i for i, (x, y) in enumerate(zip(ids, want)) if x != y), min(len(ids), len(want)))
                    problems.append(f"encode differs from {name} at token {k} ({len(ids)} ids vs {len(want)}):\n"
                                    f"        tinygpt   : {vocab.show(ids[max(k - 2, 0):k + 4])}\n"
                                    f"        {name:<10}: {vocab.show(want[max(k - 2, 0):k + 4])}")
        # decode what the reference says, so a decode check does not hang on an encode bug
        ref = next(iter(peers.values()))(text)
        out, err = run_cli(args.tinygpt, ["decode", "--tokenizer", args.tokenizer, "--ids", " ".join(map(str, ref))])
        if err:
            problems.append(f"decode: {err}")
        else:
            want = text.encode("utf-8")
            if out == want:
                decode_endings["text"] = decode_endings.get("text", 0) + 1
            elif out == want + b"\n":
                decode_endings["text + newline"] = decode_endings.get("text + newline", 0) + 1
            else:
                problems.append(f"decode printed {out[:120]!r}, want {want[:120]!r} (or with a newline)")
        if len(peers) == 2:
            a, b = (fn(text) for fn in peers.values())
            if a != b:
                problems.append("the peers disagree with each other (tiktoken merges the pair whose result has the "
                                "lowest id, tokenizers the pair that comes first in the merges list):\n"
                                f"        tokenizers: {vocab.show(a[:12])}\n        tiktoken  : {vocab.show(b[:12])}")
        status = "ok" if not problems else "MISMATCH"
        print(f"{status:<8} {label:<32} {len(text):5d} chars")
        for p in problems:
            print(f"    {p}")
        failures += bool(problems)

    # Not pass/fail: a literal "<|endoftext|>" in the text. tokenizers matches added tokens in any text,
    # tiktoken's encode_ordinary does not; print what each does, tinygpt included.
    text = f"a{EOT}b"
    out, err = run_cli(args.tinygpt, ["encode", "--tokenizer", args.tokenizer, "--text", text])
    print(f"\ninformation, {text!r}: tinygpt {err or out.decode('ascii', 'replace').strip()!r}; "
          f"tokenizers {hf.encode(text, add_special_tokens=False).ids}; tiktoken {enc.encode_ordinary(text)}")
    print(f"decode output ended as: {decode_endings or 'no decode succeeded'}")
    print(f"\n{len(cases) - failures} passed, {failures} failed")
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog="See the module docstring (head of this file) for the conventions.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train", help="time the peers' training of a byte-level BPE on every file of DIR")
    t.add_argument("--data", required=True, metavar="DIR")
    t.add_argument("--vocab-size", type=int, required=True, metavar="N",
                   help="total vocabulary: 256 bytes + merges + the end-of-text token")
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--repeats", type=int, default=3)
    t.add_argument("--save", metavar="TOK_JSON", help="write the tokenizers vocabulary of the last run there")
    e = sub.add_parser("encode", help="time the peers' encoding of DIR and compare with tinygpt's ids")
    e.add_argument("--tokenizer", required=True, metavar="TOK_JSON")
    e.add_argument("--data", required=True, metavar="DIR")
    e.add_argument("--ids", required=True, metavar="FILE", help="little-endian uint32 ids written by tinygpt")
    e.add_argument("--threads", type=int, default=2)
    e.add_argument("--repeats", type=int, default=3)
    c = sub.add_parser("check", help="compare tinygpt's tokenizer CLI with the peers on tricky strings")
    c.add_argument("--tokenizer", required=True, metavar="TOK_JSON")
    c.add_argument("--tinygpt", required=True, metavar="PATH_TO_BINARY")
    c.add_argument("--against", choices=["both", "tokenizers", "tiktoken"], default="both",
                   help="which peers tinygpt must match (default both, which also requires them to agree)")
    args = ap.parse_args()
    if getattr(args, "repeats", 1) < 1 or getattr(args, "threads", 1) < 1:
        die("--repeats and --threads must be at least 1")
    return {"train": cmd_train, "encode": cmd_encode, "check": cmd_check}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
