#!/usr/bin/env bash
# A corpus of real text for the tokenizer benchmarks (bench/tokenizer_peers.py): about MB megabytes (MiB, 2^20 bytes;
# default 100) of source code and documentation copied from this machine's system directories into OUT_DIR, each
# file under its absolute path less the leading "/" (OUT_DIR/usr/include/stdio.h, ...). Never needed by the build.
#
#   bash bench/make_text_corpus.sh OUT_DIR [MB]
#
# What is taken, from whichever of these exist, in groups taken in turn (one file of each group per round, so that a
# small corpus already mixes languages): C headers (/usr/include), Python (/usr/lib/python3*, pyenv's
# ~/.pyenv/versions/*/lib/python3*), documentation (/usr/share/doc, /usr/share/info, /usr/share/vim), Perl
# (/usr/share/perl*, /usr/lib/x86_64-linux-gnu/perl*), Pascal (/usr/share/fpcsrc), JavaScript (/usr/lib/node_modules,
# /usr/share/javascript), and the rest (/usr/share/cmake*, /usr/share/i18n, tcl, postgresql, zsh). Inside a group, its
# directories in that order and each one's files sorted by path bytes, so the result is the same on the same machine.
# A file is skipped when it is a symbolic link, empty, over 4 MiB, compressed (.gz .bz2 .xz .zst .lz .lzma .Z .zip
# .tgz), has a NUL byte in its first 8 KiB, has a name that is not printable ASCII, or has the same content as a file
# already taken (pyenv's Python versions share most of their files). Files that are not valid UTF-8 are kept: a
# byte-level tokenizer must take them.
#
# OUT_DIR must be empty or absent. Prints the number of files and of bytes on its last line.
set -euo pipefail
[ $# -ge 1 ] && [ $# -le 2 ] || { echo "usage: $0 OUT_DIR [MB]" >&2; exit 2; }
out=$1
mb=${2:-100}
case "$mb" in '' | *[!0-9]*) echo "error: MB must be a whole number, got '$mb'" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")/.." && pwd -P)
case "$(realpath -m "$out")/" in
  "$here"/*) echo "error: $out is inside the source tree; pick a directory outside it" >&2; exit 2 ;;
esac
if [ -e "$out" ] && [ -n "$(ls -A "$out")" ]; then echo "error: $out is not empty" >&2; exit 2; fi
command -v python3 > /dev/null || { echo "error: python3 not found" >&2; exit 1; }
exec python3 - "$(realpath -m "$out")" "$mb" "$HOME" << 'PY'
import glob, hashlib, os, sys

out, budget, home = sys.argv[1], int(sys.argv[2]) << 20, sys.argv[3]
MAX_FILE = 4 << 20
COMPRESSED = (".gz", ".bz2", ".xz", ".zst", ".lz", ".lzma", ".Z", ".zip", ".tgz")


def roots(*patterns):
    found = []
    for pattern in patterns:
        for d in sorted(glob.glob(pattern)):
            real = os.path.realpath(d)
            if os.path.isdir(d) and real not in found:
                found.append(real)
    return found


groups = [
    roots("/usr/include"),
    roots("/usr/lib/python3", "/usr/lib/python3.*", home + "/.pyenv/versions/*/lib/python3*"),
    roots("/usr/share/doc", "/usr/share/info", "/usr/share/vim"),
    roots("/usr/share/perl", "/usr/share/perl5", "/usr/lib/x86_64-linux-gnu/perl*"),
    roots("/usr/share/fpcsrc"),
    roots("/usr/lib/node_modules", "/usr/share/javascript"),
    roots("/usr/share/cmake*", "/usr/share/i18n", "/usr/share/tcltk", "/usr/lib/tcl8.6", "/usr/share/postgresql",
          "/usr/share/zsh"),
]
groups = [g for g in groups if g]
if not groups:
    sys.exit("error: none of the source directories exists")


def files_of(group):
    """The group's candidate files, lazily: each directory's files sorted by path bytes, symbolic links not followed."""
    for root in group:
        paths = []
        for d, subdirs, names in os.walk(root, followlinks=False):
            for name in names:
                paths.append(os.path.join(d, name))
        paths.sort(key=os.fsencode)
        yield from paths


def printable_ascii(path):
    return all(" " <= ch <= "~" for ch in path)


seen, taken, total = set(), 0, 0
iters = [files_of(g) for g in groups]
while iters and total < budget:
    for it in list(iters):
        if total >= budget:
            break
        for path in it:
            if not printable_ascii(path) or path.endswith(COMPRESSED) or os.path.islink(path):
                continue
            try:
                if not os.path.isfile(path) or not 0 < os.path.getsize(path) <= MAX_FILE:
                    continue
                with open(path, "rb") as f:
                    data = f.read(MAX_FILE + 1)
            except OSError:
                continue
            if b"\0" in data[:8192] or not 0 < len(data) <= MAX_FILE:
                continue
            digest = hashlib.sha1(data).digest()
            if digest in seen:
                continue
            seen.add(digest)
            dest = os.path.join(out, path.lstrip("/"))
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as f:
                f.write(data)
            taken += 1
            total += len(data)
            break
        else:
            iters.remove(it)  # this group has no file left

print(f"{out}: {taken} files, {total} bytes ({total / (1 << 20):.1f} MiB) in {len(groups)} groups")
PY
