"""Checks tinygpt's NFC (data/nfc.cpp, applied by a tokenizer whose normalizer is NFC, as Qwen2's) against Python's
unicodedata2 16.0 and the `tokenizers` package's NFC normalizer, on random strings built to exercise normalization:
combining marks of many classes in every order, precomposed letters, Hangul jamo and syllables, singletons, non-starter
decompositions, composition exclusions, scripts whose vowels compose (Indic, Sinhala, Tibetan, the scripts new in
Unicode 16), and ill-formed UTF-8 (which must pass through unchanged). A tokenizer of the 256 bytes alone with an NFC
normalizer makes `tinygpt tokenizer encode` print the normalized text's bytes.

Run by developers, not by CI:

  python3 -m venv /tmp/venv-ud && /tmp/venv-ud/bin/pip install unicodedata2==16.0.0 tokenizers
  /tmp/venv-ud/bin/python tests/reference/check_nfc.py [--build build] [--count 20000]

Exit status: 0 all agree with unicodedata2, 1 a string differs, 77 unicodedata2 16.0.0 is missing.
"""
import argparse
import json
import pathlib
import random
import struct
import subprocess
import sys
import tempfile

try:
    import unicodedata2 as ud
except ImportError:
    ud = None
if ud is None or ud.unidata_version != "16.0.0":
    print("skipped: unicodedata2 16.0.0 is not installed (pip install unicodedata2==16.0.0)")
    sys.exit(77)
try:
    from tokenizers import normalizers
except ImportError:
    normalizers = None

p = argparse.ArgumentParser()
p.add_argument("--build", default="build")
p.add_argument("--count", type=int, default=20000)
a = p.parse_args()
tinygpt = f"{a.build}/tinygpt"

pools = [range(0x41, 0x5B), range(0x61, 0x7B), range(0xC0, 0x180), range(0x1E00, 0x1F00), range(0x1F00, 0x2000),
         range(0x300, 0x370), range(0x483, 0x48A), range(0x591, 0x5C8), range(0x610, 0x620), range(0x64B, 0x660),
         range(0x900, 0x980), range(0x9BC, 0x9D8), range(0xB3C, 0xB58), range(0xBBE, 0xBD8), range(0xCBC, 0xCD7),
         range(0xD3E, 0xD58), range(0xDCA, 0xDE0), range(0xF71, 0xF86), range(0x1100, 0x1113), range(0x1161, 0x1176),
         range(0x11A8, 0x11C3), range(0xAC00, 0xAC40), range(0xD7A0, 0xD7A4), range(0xF900, 0xF920),
         range(0x2F800, 0x2F810), range(0x1D15E, 0x1D165), range(0x11300, 0x11350), range(0x113B8, 0x113C9),
         range(0x16121, 0x16130), range(0x16D63, 0x16D6B), range(0x1611E, 0x1612A), range(0x105C9, 0x105CA),
         [0x212B, 0x2126, 0x340, 0x341, 0x343, 0x344, 0x374, 0x37E, 0x387, 0xF73, 0xF75, 0xF81, 0x2ADC, 0x1B05,
          0x1B35, 0x3099, 0x309A, 0x304B, 0x30AB, 0x20, 0x2E, 0x4E00, 0x1F600]]
weights = [3, 3, 4, 3, 2, 8, 1, 2, 1, 1, 2, 2, 2, 1, 1, 1, 1, 1, 3, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 3]
rng = random.Random(7)
texts = []
for _ in range(a.count):
    cps = [rng.choice(rng.choices(pools, weights)[0]) for _ in range(rng.randint(1, 10))]
    s = "".join(chr(c) for c in cps if not 0xD800 <= c <= 0xDFFF).encode()
    if rng.random() < 0.05:  # ill-formed UTF-8 somewhere: a stray continuation byte or a cut sequence
        i = rng.randint(0, len(s))
        s = s[:i] + rng.choice([b"\x80", b"\xcc", b"\xe1\x84", b"\xff", b"\xc0\xaf"]) + s[i:]
    texts.append(s)

with tempfile.TemporaryDirectory() as t:
    tmp = pathlib.Path(t)
    (tmp / "seed.txt").write_text("a")
    subprocess.run([tinygpt, "tokenizer", "train", "--data", tmp / "seed.txt", "--vocab-size", "257", "--out",
                    tmp / "bytes.json"], check=True, capture_output=True)
    tok = json.loads((tmp / "bytes.json").read_text())
    tok["normalizer"] = {"type": "NFC"}
    (tmp / "nfc.json").write_text(json.dumps(tok))
    byte_of = {}  # token id -> byte, through the byte-level alphabet
    alphabet = [b for b in range(256) if chr(b).isprintable() and b not in (0x20, 0x7F, 0xAD)]
    spelled = {b: chr(b) for b in alphabet}
    n = 0
    for b in range(256):
        if b not in spelled:
            spelled[b] = chr(256 + n)
            n += 1
    for b, ch in spelled.items():
        byte_of[tok["model"]["vocab"][ch]] = b
    docs = tmp / "docs"
    docs.mkdir()
    for k, s in enumerate(texts):
        (docs / f"{k:06d}.txt").write_bytes(s)
    subprocess.run([tinygpt, "tokenizer", "encode", "--tokenizer", tmp / "nfc.json", "--data", docs, "--out",
                    tmp / "ids.bin"], check=True, capture_output=True)
    data = (tmp / "ids.bin").read_bytes()
    ids = struct.unpack(f"<{len(data) // 4}I", data)
    eot = tok["added_tokens"][0]["id"]
    outs, cur = [], bytearray()
    for i in ids:
        if i == eot:
            outs.append(bytes(cur))
            cur = bytearray()
        else:
            cur.append(byte_of[i])

# Scripts new in Unicode 16.0 whose vowels compose (Todhri, Tulu-Tigalari, Gurung Khema, Kirat Rai): tables older
# than 16.0, as the `tokenizers` package's, do not know them.
NEW_IN_16 = [(0x105C0, 0x105FF), (0x11380, 0x113FF), (0x16100, 0x1613F), (0x16D40, 0x16D7F)]
ok_ud = ok_tok = differ_tok = differ_new = 0
shown = 0
for s, got in zip(texts, outs):
    # Ill-formed bytes as lone surrogates (surrogateescape): starters that compose with nothing, given back as bytes.
    want = ud.normalize("NFC", s.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")
    if got == want:
        ok_ud += 1
    elif shown < 10:
        shown += 1
        print(f"DIFFERS from unicodedata2: {s!r}: tinygpt {got!r}, unicodedata2 {want!r}")
    if normalizers is not None and s.decode("utf-8", "ignore").encode() == s:
        theirs = normalizers.NFC().normalize_str(s.decode()).encode()
        if theirs == got:
            ok_tok += 1
        else:
            differ_tok += 1
            differ_new += any(lo <= ord(c) <= hi for c in s.decode() for lo, hi in NEW_IN_16)
            if differ_tok <= 3:
                print(f"tokenizers differs: {s.decode()!r} ({' '.join(f'U+{ord(c):04X}' for c in s.decode())}): "
                      f"tinygpt {got.decode()!r}, tokenizers {theirs.decode()!r}")
well_formed = sum(1 for s in texts if s.decode("utf-8", "ignore").encode() == s)
print(f"{len(texts)} strings ({len(texts) - well_formed} ill-formed): {ok_ud} as unicodedata2 {ud.unidata_version} "
      f"normalizes them" + (f"; tokenizers' NFC gives tinygpt's text on {ok_tok} of the {well_formed} well-formed, "
                            f"another on {differ_tok} ({differ_new} of them with characters new in Unicode 16.0)" if normalizers else ""))
sys.exit(0 if ok_ud == len(texts) else 1)
