#!/usr/bin/env bash
# Peak memory of training on a large corpus: `train --tokenizer FILE` with a folder of text files linked COPIES times
# over (symbolic links to the same files under COPIES subfolders: the walk takes each link as a document of its own), batch 8, 2
# iterations, a fresh run directory each time (so the token cache is written), then the same run again (the cache
# mapped). Prints one table: corpus bytes, documents, tokens, the tokenizing rate, and the peak resident set with its
# anonymous part (the program's own memory) and its file-backed part (mapped pages of the text and the cache), sampled
# from /proc every 20 ms, plus the kernel's own peak (VmHWM) at exit. The first row, one copy of the smallest corpus
# (shakespeare, under the same tokenizer, so the same model), is the program's own pages: model, optimizer, binary.
#
#   bash bench/corpus_memory.sh BUILD_DIR CORPUS_DIR TOKENIZER_JSON COPIES... [-- extra train flags]
#   e.g. bash bench/corpus_memory.sh build /tmp/corp100 /tmp/tok.json 10 40
#
# With ONE_FILE_MB=N set, a last row trains on one file of N MB (the corpus's files joined, over again), which a
# BPE run splits by position (the last tenth of its ids validates). With CGROUP_MB=N set, each run is also made inside a memory cgroup (v1 or v2) of N MiB, and the table says whether
# it finished. Needs a few GB free beside TMPDIR for the caches (about 2 bytes per token).
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 BUILD_DIR CORPUS_DIR TOKENIZER_JSON [COPIES...] [-- train flags]" >&2; exit 2; }
build=$1 corpus=$2 tok=$3
shift 3
copies=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do copies+=("$1"); shift; done
[ "${1:-}" = "--" ] && shift
extra=("$@")
bin=$build/tinygpt
[ -x "$bin" ] || { echo "error: $bin not found; build first" >&2; exit 1; }
[ -d "$corpus" ] || { echo "error: $corpus is not a directory (make one: bash bench/make_text_corpus.sh DIR 100)" >&2; exit 1; }
[ -f "$tok" ] || { echo "error: $tok not found (make one: $bin tokenizer train --data $corpus --vocab-size 4096 --out $tok)" >&2; exit 1; }
here=$(cd "$(dirname "$0")/.." && pwd -P)
shakespeare=$here/../shared/data/tinyshakespeare.txt
work=$(mktemp -d "${TMPDIR:-/tmp}/tinygpt-corpus-memory.XXXXXX")
trap 'rm -rf "$work"' EXIT

# Runs "$@", sampling the peak RssAnon and RssFile of the process every 20 ms; prints "anon_kB file_kB hwm_kB rc".
measure() {
  "$@" > "$work/out.txt" 2> "$work/err.txt" &
  local pid=$! anon=0 file=0 hwm=0 a f h
  while kill -0 "$pid" 2> /dev/null; do
    if read -r a f h < <(awk '/^RssAnon/{a=$2} /^RssFile/{f=$2} /^VmHWM/{h=$2} END{print a+0, f+0, h+0}' \
      "/proc/$pid/status" 2> /dev/null); then
      [ "$a" -gt "$anon" ] && anon=$a
      [ "$f" -gt "$file" ] && file=$f
      [ "$h" -gt "$hwm" ] && hwm=$h
    fi
    sleep 0.02
  done
  local rc=0
  wait "$pid" || rc=$?
  echo "$anon $file $hwm $rc"
}

# A command line run inside a fresh memory cgroup of CGROUP_MB MiB (v2 where mounted so, else v1).
in_cgroup() {
  local cg
  if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
    cg=/sys/fs/cgroup/tinygpt-bench-$$
    mkdir "$cg" && echo "$((CGROUP_MB << 20))" > "$cg/memory.max"
  else
    cg=/sys/fs/cgroup/memory/tinygpt-bench-$$
    mkdir "$cg" && echo "$((CGROUP_MB << 20))" > "$cg/memory.limit_in_bytes"
  fi
  local rc=0
  sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$cg" "$@" || rc=$?
  rmdir "$cg" 2> /dev/null || true
  return $rc
}

run_row() {  # label data_dir
  local label=$1 data=$2 bytes docs pass
  bytes=$(find -L "$data" -type f -printf '%s\n' | awk '{s += $1} END {printf "%.2f", s / 1e9}')
  docs=$(find -L "$data" -type f | wc -l)
  local cmd=("$bin" train --data "$data" --tokenizer "$tok" --out "$work/run" --batch-size 8 --max-iters 2
    --eval-iters 2 "${extra[@]}")
  local rows=()
  rm -rf "$work/run"
  for pass in write mapped; do
    read -r anon file hwm rc < <(measure "${cmd[@]}")
    [ "$rc" = 0 ] || { echo "error: $label ($pass) failed:" >&2; tail -3 "$work/err.txt" >&2; exit 1; }
    local tokens rate
    tokens=$(grep -o '[0-9]* tokens, ' "$work/err.txt" | head -1 | cut -d' ' -f1)
    rate=$(grep -o 'tokenizing [0-9]* files\?: .* MB/s)' "$work/err.txt" | grep -o '([0-9.]* MB/s)' | tr -d '()' || true)
    rows+=("| $label | $pass | $bytes GB | $docs | ${tokens:-?} | ${rate:--} | $((anon >> 10)) | $((file >> 10)) | $((hwm >> 10))")
  done
  local cg=("-" "-")
  if [ -n "${CGROUP_MB:-}" ]; then  # the same two runs inside the cgroup: the cache written, then mapped
    rm -rf "$work/run"
    for k in 0 1; do
      if in_cgroup "${cmd[@]}" > /dev/null 2>&1; then cg[k]="finished"; else cg[k]="killed or failed ($?)"; fi
    done
  fi
  echo "${rows[0]} | ${cg[0]} |"
  echo "${rows[1]} | ${cg[1]} |"
}

echo "| corpus | cache | bytes | documents | tokens | tokenizing | peak anon MiB | peak file MiB | VmHWM MiB | cgroup ${CGROUP_MB:-} MiB |"
echo "|---|---|---|---|---|---|---|---|---|---|"
mkdir -p "$work/small" && ln -s "$(realpath "$shakespeare")" "$work/small/shakespeare.txt"
run_row "shakespeare (the program's own)" "$work/small"
for n in "${copies[@]}"; do
  rm -rf "$work/linked"
  mkdir -p "$work/linked"
  for ((i = 0; i < n; i++)); do cp -rs "$(realpath "$corpus")" "$work/linked/copy$i"; done
  run_row "$(basename "$corpus") x $n" "$work/linked"
done
if [ -n "${ONE_FILE_MB:-}" ]; then
  mkdir -p "$work/one"
  while [ "$(stat -c %s "$work/one/all.txt" 2> /dev/null || echo 0)" -lt "$((ONE_FILE_MB * 1000000))" ]; do
    find "$corpus" -type f -print0 | sort -z | xargs -0 cat >> "$work/one/all.txt"
  done
  truncate -s "$((ONE_FILE_MB * 1000000))" "$work/one/all.txt"
  run_row "$(basename "$corpus") joined, one file" "$work/one"
fi
