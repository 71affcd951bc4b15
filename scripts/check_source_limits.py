#!/usr/bin/env python3
"""The house's two size limits on the C++ and CUDA sources outside tests/: no file over 800 lines and no function
over 100 (a function counted from the first line of its declaration to its closing brace; lambdas count in the
function that holds them). Prints each breach and exits 1 if there is one; --list prints every function's length.

    python3 scripts/check_source_limits.py [--list] [ROOT]

The scan is lexical, not a C++ parser: comments, string and character literals and preprocessor lines are removed,
then every brace opened where a function may begin (at namespace or class scope) is classed by the text before it:
namespace, class/struct/union/enum, a function (the text has a parameter list), or an initializer.
"""
import re
import subprocess
import sys
from pathlib import Path

MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 100
SOURCE_DIRS = ("autograd", "nn", "kernels", "data", "train", "examples", "bench", "fuzz")
SUFFIXES = (".cpp", ".h", ".cu", ".cuh", ".hpp", ".cc")


def strip(text):
    """The text with comments, literals and preprocessor lines blanked out; newlines kept, so lines still count."""
    out, i, n = [], 0, len(text)
    at_line_start = True
    while i < n:
        c = text[i]
        if at_line_start and c in " \t":
            out.append(c)
            i += 1
            continue
        if at_line_start and c == "#":  # a preprocessor line, with its continuations
            while i < n and text[i] != "\n":
                if text[i] == "\\" and i + 1 < n and text[i + 1] == "\n":
                    out.append("\n")
                    i += 2
                    continue
                i += 1
            continue
        at_line_start = False
        if text.startswith("//", i):
            while i < n and text[i] != "\n":
                i += 1
            continue
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("\n" * text.count("\n", i, j))
            i = j
            continue
        raw = re.match(r'R"([^(\s]*)\(', text[i:i + 20]) if c == "R" else None
        if raw and (i == 0 or not (text[i - 1].isalnum() or text[i - 1] == "_")):
            end = text.find(")" + raw.group(1) + '"', i)
            end = n if end < 0 else end + len(raw.group(1)) + 2
            out.append('""' + "\n" * text.count("\n", i, end))
            i = end
            continue
        if c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():  # a digit separator (1'000'000)
                i += 1
                continue
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + c)
            i = j + 1
            continue
        if c == "\n":
            at_line_start = True
        out.append(c)
        i += 1
    return "".join(out)


def drop_template_prefix(header):
    """header without a leading template <...> (angle brackets balanced)."""
    m = re.match(r"\s*template\s*<", header)
    if not m:
        return header
    depth, i = 1, m.end()
    while i < len(header) and depth:
        depth += {"<": 1, ">": -1}.get(header[i], 0)
        i += 1
    return drop_template_prefix(header[i:])


def classify(header):
    h = drop_template_prefix(header).strip()
    if re.match(r"(inline\s+)?namespace\b", h) or re.match(r'extern\s*""\s*$', h) or h.startswith("extern"):
        return "namespace"
    if re.match(r"(typedef\s+)?(class|struct|union|enum)\b", h) and not re.search(r"\)\s*(const\s*)?$", h):
        return "class"
    if re.search(r"=\s*$", h) or not h:
        return "init"
    if "(" in h:
        return "function"
    return "init"


def functions(path):
    """(first line, last line, name) of each function in the file."""
    text = strip(path.read_text(encoding="utf-8", errors="replace"))
    stack = []  # kinds of the open braces
    found, header_start, line = [], 0, 1
    starts = []  # the first line of each open function
    for i, c in enumerate(text):
        if c == "\n":
            line += 1
            continue
        if c in ";{}" and (not stack or stack[-1] in ("namespace", "class")):
            header = text[header_start:i]
            if c == "{":
                kind = classify(header)
                stack.append(kind)
                if kind == "function":
                    offset = len(header) - len(header.lstrip())
                    first = line - header.count("\n") + header[:offset].count("\n")
                    name = re.sub(r"\s+", " ", header.strip().split("(")[0])[-60:]
                    starts.append((first, name))
            elif c == "}" and stack:
                stack.pop()
            header_start = i + 1
            continue
        if c == "{":
            stack.append("block")
        elif c == "}" and stack:
            kind = stack.pop()
            if kind == "function":
                first, name = starts.pop()
                found.append((first, line, name))
            if not stack or stack[-1] in ("namespace", "class"):
                header_start = i + 1
    return found


def source_files(root):
    """The tracked files under SOURCE_DIRS (every file there outside a git checkout)."""
    try:
        listed = subprocess.run(["git", "ls-files", *SOURCE_DIRS], cwd=root, capture_output=True, text=True, check=True)
        return sorted(listed.stdout.split())
    except (OSError, subprocess.CalledProcessError):
        return sorted(str(p.relative_to(root)) for d in SOURCE_DIRS for p in (root / d).rglob("*") if p.is_file())


def main(argv):
    list_all = "--list" in argv
    args = [a for a in argv if a != "--list"]
    root = Path(args[0]) if args else Path(__file__).resolve().parent.parent
    breaches = 0
    for name in source_files(root):
        path = root / name
        if not name.endswith(SUFFIXES) or not path.is_file():
            continue
        lines = path.read_text(encoding="utf-8", errors="replace").count("\n")
        if lines > MAX_FILE_LINES:
            print(f"{name}: {lines} lines (at most {MAX_FILE_LINES}): split it along its seams")
            breaches += 1
        for first, last, fn in functions(path):
            length = last - first + 1
            if list_all:
                print(f"{length:5d} {name}:{first} {fn}")
            if length > MAX_FUNCTION_LINES:
                print(f"{name}:{first}: {fn}: {length} lines (at most {MAX_FUNCTION_LINES}): split it")
                breaches += 1
    if breaches:
        print(f"check_source_limits: {breaches} over the limits")
        return 1
    print(f"check_source_limits: every file within {MAX_FILE_LINES} lines, every function within {MAX_FUNCTION_LINES}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
