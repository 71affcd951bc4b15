#!/usr/bin/env bash
# The text path probed as a hostile user would: --data directories with symlink loops, dangling links, unreadable
# entries and files that change between runs; token caches truncated, swapped in from another run, made by another
# tokenizer or left half-written by a signal; tokenizer.json files of absurd sizes; two runs after the same run
# directory at once; data files cut short or removed while a cache is written. Each probe ends in one `error:` line
# with exit 1 or 2, or in a run that reads the right text (the cache rebuilt, never half-used), or in a skip said
# once; never a crash or a hang.
#   tests/text_probes.sh path/to/tinygpt
set -uo pipefail
tinygpt=$1
dir=$(mktemp -d)
trap 'chmod -R u+rwx "$dir" 2> /dev/null; rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
# expect STATUS PATTERN COMMAND...: exits STATUS with exactly one error line matching PATTERN, within 60 s.
expect() {
  local want=$1 pattern=$2
  shift 2
  timeout 60 "$@" > "$dir/out" 2> "$dir/err"
  local got=$?
  if [ "$got" != "$want" ]; then
    fail "'$*' exited $got, not $want: $(tail -2 "$dir/err")"
  elif [ "$(grep -c '^error:' "$dir/err")" != 1 ] || ! grep -q -- "$pattern" "$dir/err"; then
    fail "'$*' said '$(grep '^error:' "$dir/err")'; expected one error line matching '$pattern'"
  fi
}
# runs COMMAND...: exits 0 within 120 s (a hang is a failure).
runs() {
  timeout 120 "$@" > "$dir/out" 2> "$dir/err" || fail "'$*' exited $?: $(tail -2 "$dir/err")"
}
tiny=(--n-layer 1 --n-head 2 --n-embd 32 --block-size 16 --batch-size 4 --eval-iters 1 --max-iters 2 --eval-interval 2)
# The data line of a train log: "data: 2 files, 524 tokens, ...": its file count, and its token count.
files_of() { sed -n 's/^data: \([0-9]*\) files\?, .*/\1/p' "$1" | head -n 1; }
tokens_of() { sed -n 's/^data: [0-9]* files\?, \([0-9]*\) tokens.*/\1/p' "$1" | head -n 1; }

mkdir -p "$dir/notes/sub"
for i in $(seq 60); do echo "a note about the cat and the mat, number $i"; done > "$dir/notes/a.txt"
for i in $(seq 60); do echo "another note, of dogs and logs, number $i"; done > "$dir/notes/sub/b.txt"
"$tinygpt" tokenizer train --data "$dir/notes" --vocab-size 300 --out "$dir/tok.json" 2> /dev/null ||
  fail "tokenizer train on the notes failed"

# Symlinks: a loop back to the folder, a cycle of two links, a dangling one. The walk ends, reads each file once.
ln -s .. "$dir/notes/sub/up"
ln -s "$dir/notes/loop2" "$dir/notes/loop1"
ln -s "$dir/notes/loop1" "$dir/notes/loop2"
ln -s "$dir/nowhere.txt" "$dir/notes/dangling.txt"
runs "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" --out "$dir/r1" "${tiny[@]}"
n=$(files_of "$dir/err")
[ "$n" = 2 ] || fail "a folder of two files with symlink loops read as '$n' files: $(grep -e '^data' -e skip "$dir/err" | head -3)"

# An entry the user cannot read: skipped with a note naming it, the run trains on the rest. Root reads everything, so
# as root the probe runs as nobody (setpriv), where nobody can run the program; else it is skipped, said once.
cp "$dir/notes/a.txt" "$dir/notes/locked.txt"
chmod 000 "$dir/notes/locked.txt"
as_user=()
if [ "$(id -u)" = 0 ]; then
  if command -v setpriv > /dev/null && setpriv --reuid=65534 --regid=65534 --clear-groups "$tinygpt" --version > /dev/null 2>&1; then
    as_user=(setpriv --reuid=65534 --regid=65534 --clear-groups)
    chmod 755 "$dir" "$dir/notes" "$dir/notes/sub"
    chmod 644 "$dir/tok.json" "$dir/notes/a.txt" "$dir/notes/sub/b.txt"
    mkdir -m 777 "$dir/open"
  else
    echo "text_probes: the unreadable-file probe is skipped: root reads every file, and nobody cannot run $tinygpt"
  fi
fi
if [ "$(id -u)" != 0 ] || [ ${#as_user[@]} -gt 0 ]; then
  out=$([ ${#as_user[@]} -gt 0 ] && echo "$dir/open/r2" || echo "$dir/r2")
  runs "${as_user[@]}" "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" --out "$out" "${tiny[@]}"
  grep -q "^skipping .*locked.txt: unreadable" "$dir/err" || fail "an unreadable file was not skipped, said so: $(head -3 "$dir/err")"
  [ "$(files_of "$dir/err")" = 2 ] || fail "with an unreadable file the run read: $(grep '^data' "$dir/err")"
fi
chmod 644 "$dir/notes/locked.txt"
rm "$dir/notes/locked.txt"

# A file that changes between runs is encoded again; the others come from the cache.
runs "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" --out "$dir/r3" "${tiny[@]}"
echo "a line added later about birds" >> "$dir/notes/a.txt"
runs "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" --out "$dir/r3" "${tiny[@]}" --resume --max-iters 4
grep -q "1 file encoded, 1 mapped from" "$dir/err" || fail "the changed file was not the one encoded again: $(grep '^data' "$dir/err")"
clean=$(tokens_of "$dir/err")

# Token caches: truncated, swapped in from another run, made with another tokenizer. Each is noticed and encoded
# again (the run then trains on the right text), or refused with one error; never half-used.
mkdir -p "$dir/other"
for i in $(seq 80); do echo "entirely different text, full of zebras and quartz $i"; done > "$dir/other/z.txt"
runs "$tinygpt" train --data "$dir/other" --tokenizer "$dir/tok.json" --out "$dir/r4" "${tiny[@]}"
cache_probe() {  # cache_probe NAME: the run r3 resumed over its damaged cache reads its own two documents
  timeout 120 "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" --out "$dir/r3" "${tiny[@]}" --resume \
    --max-iters "$1" > "$dir/out" 2> "$dir/err"
  local rc=$?
  if [ "$rc" = 0 ]; then
    [ "$(files_of "$dir/err")" = 2 ] && [ "$(tokens_of "$dir/err")" = "$clean" ] ||
      fail "$2: the run read $(grep '^data' "$dir/err"), not its own 2 files and $clean tokens"
  elif [ "$rc" != 1 ] || [ "$(grep -c '^error:' "$dir/err")" != 1 ]; then
    fail "$2: exit $rc: $(tail -2 "$dir/err")"
  fi
}
cp "$dir/r3/tokens.bin" "$dir/tokens.good"
size=$(stat -c %s "$dir/r3/tokens.bin")
truncate -s $((size / 2)) "$dir/r3/tokens.bin"
cache_probe 6 "a truncated token cache"
truncate -s 20 "$dir/r3/tokens.bin"
cache_probe 8 "a token cache cut inside its header"
cp "$dir/r4/tokens.bin" "$dir/r3/tokens.bin"
cache_probe 10 "another run's token cache"
"$tinygpt" tokenizer train --data "$dir/other" --vocab-size 290 --out "$dir/tok2.json" 2> /dev/null
runs "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok2.json" --out "$dir/r5" "${tiny[@]}"
cp "$dir/r5/tokens.bin" "$dir/r3/tokens.bin"
cache_probe 12 "a token cache of another tokenizer"
head -c "$size" /dev/urandom > "$dir/r3/tokens.bin"
cache_probe 14 "a token cache of random bytes"

# A signal while the cache is written: the run ends with one error line and exit 130, its temporary files removed;
# the next run finds the previous cache or none, never half of one. Then the same for `tokenizer encode --data`.
for i in $(seq 40000); do echo "line $i of a longer file, so that encoding it takes a moment: the quick brown fox"; done > "$dir/notes/long.txt"
for k in 2 4 6 8; do
  rm -rf "$dir/r6"
  "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" --out "$dir/r6" "${tiny[@]}" > /dev/null 2> "$dir/kill.err" &
  pid=$!
  sleep "0.$k"
  kill -TERM "$pid" 2> /dev/null
  wait "$pid" 2> /dev/null
  rc=$?
  left=$(ls "$dir/r6" 2> /dev/null | grep "\.tmp$" | tr '\n' ' ')
  [ -z "$left" ] || fail "SIGTERM after 0.${k}s left temporary files in the run: $left"
  # 130: stopped while reading the data (one error line), or in training (a checkpoint saved); 143: before either.
  if [ "$rc" = 130 ] && ! grep -q "^stopped by a signal after iteration" "$dir/kill.err"; then
    [ "$(grep -c '^error: stopped by a signal' "$dir/kill.err")" = 1 ] || fail "SIGTERM while reading the data said: $(tail -2 "$dir/kill.err")"
  elif [ "$rc" != 130 ] && [ "$rc" != 143 ] && [ "$rc" != 0 ]; then
    fail "SIGTERM after 0.${k}s: exit $rc: $(tail -2 "$dir/kill.err")"
  fi
done
"$tinygpt" tokenizer encode --tokenizer "$dir/tok.json" --data "$dir/notes" --out "$dir/ids.bin" 2> /dev/null &
pid=$!
sleep 0.3
kill -INT "$pid" 2> /dev/null
wait "$pid" 2> /dev/null
[ ! -e "$dir/ids.bin.tmp" ] || fail "SIGINT during tokenizer encode --data left ids.bin.tmp"
runs "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" --out "$dir/r6" "${tiny[@]}"
[ "$(files_of "$dir/err")" = 3 ] || fail "after runs stopped while writing the cache, the next read: $(grep '^data' "$dir/err")"

# during_pass WHAT LABEL ERROR_PATTERN: trains on $dir/big into $dir/r9, runs WHAT 0.3 s in (while the long file is
# read), and expects one error line matching ERROR_PATTERN with exit 1 (or a skip when the pass ended first), and no
# temporary file left in the run.
during_pass() {
  local what=$1 label=$2 pattern=$3
  rm -rf "$dir/r9"
  "$tinygpt" train --data "$dir/big" --tokenizer "$dir/tok.json" --out "$dir/r9" "${tiny[@]}" > /dev/null 2> "$dir/pass.err" &
  local pid=$!
  sleep 0.3
  eval "$what"
  wait "$pid" 2> /dev/null
  local rc=$?
  if [ "$rc" = 1 ]; then
    [ "$(grep -c "$pattern" "$dir/pass.err")" = 1 ] || fail "$label said: $(tail -2 "$dir/pass.err")"
  elif [ "$rc" = 0 ]; then
    echo "text_probes: the pass ended before $label happened; that probe is skipped"
  else
    fail "$label: exit $rc: $(tail -2 "$dir/pass.err")"
  fi
  local left
  left=$(ls "$dir/r9" 2> /dev/null | grep "\.tmp$" | tr '\n' ' ')
  [ -z "$left" ] || fail "$label left temporary files in the run: $left"
}
# A data file cut short by another process while the cache is written (its pages past the new end fault under the
# map: SIGBUS): one error line and exit 1; the next run encodes what the file now holds.
mkdir -p "$dir/big"
awk 'BEGIN { for (i = 1; i <= 1200000; i++) print "line " i " of a file that is cut short while it is read: the quick brown fox" }' > "$dir/big/big.txt"
during_pass 'truncate -s 4096 "$dir/big/big.txt"' "a data file cut short while read" '^error:'
runs "$tinygpt" train --data "$dir/big" --tokenizer "$dir/tok.json" --out "$dir/r9" "${tiny[@]}"
[ "$(files_of "$dir/err")" = 1 ] || fail "after a file was cut short, the next run: $(grep '^data' "$dir/err")"
# A file that vanishes while the cache is written (z.txt, after the long a.txt): one error line naming it, exit 1.
awk 'BEGIN { for (i = 1; i <= 1200000; i++) print "line " i " of a long file read before the one that vanishes" }' > "$dir/big/a.txt"
echo "the last file, removed while the first is read" > "$dir/big/z.txt"
during_pass 'rm "$dir/big/z.txt"' "a data file that vanished while read" '^error:.*z\.txt'

# Two runs after one run directory at once: one trains, the other is refused by the lock with one error line.
"$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" --out "$dir/r7" "${tiny[@]}" --max-iters 1000000 \
  --eval-interval 1000000 > /dev/null 2> "$dir/first.err" &
pid=$!
sleep 1
expect 1 "train.lock\|another tinygpt\|in use\|locked" "$tinygpt" train --data "$dir/notes" --tokenizer "$dir/tok.json" \
  --out "$dir/r7" "${tiny[@]}"
kill -TERM "$pid" 2> /dev/null
wait "$pid" 2> /dev/null

# tokenizer.json files of absurd sizes: one error line each, quickly, without allocating what they claim.
python3 - "$dir/tok.json" "$dir" <<'EOF'
import json, sys
tok, out = json.load(open(sys.argv[1])), sys.argv[2]
def save(name, j):
    with open(f"{out}/{name}.json", "w") as f:
        json.dump(j, f)
j = json.loads(json.dumps(tok)); j["model"]["vocab"]["zzz"] = 2**31; save("bigid", j)
j = json.loads(json.dumps(tok)); j["model"]["vocab"]["zzz"] = 2**64 + 5; save("hugeid", j)
j = json.loads(json.dumps(tok)); j["added_tokens"].append(dict(j["added_tokens"][0], id=4_000_000_000)); save("bigadded", j)
j = json.loads(json.dumps(tok)); j["model"]["merges"] = j["model"]["merges"] * 2000; save("manymerges", j)
j = json.loads(json.dumps(tok)); j["added_tokens"].append(dict(j["added_tokens"][0], id=len(j["model"]["vocab"]) + 1, content="x" * 5_000_000)); save("longtoken", j)
j = json.loads(json.dumps(tok)); j["model"]["vocab"] = {f"t{i}": i for i in range(300_000)}; save("vocab300k", j)
EOF
for name in bigid hugeid bigadded manymerges longtoken vocab300k; do
  timeout 60 "$tinygpt" tokenizer encode --tokenizer "$dir/$name.json" --text "the cat" > "$dir/out" 2> "$dir/err"
  rc=$?
  if [ "$rc" = 0 ]; then
    # Repeated merges and one long added token are well-formed, only large: read, bounded in time.
    [ "$name" = longtoken ] || [ "$name" = manymerges ] || fail "the tokenizer $name was read: $(head -c 100 "$dir/out")"
  elif [ "$rc" != 1 ] || [ "$(grep -c '^error:' "$dir/err")" != 1 ]; then
    fail "the tokenizer $name: exit $rc: $(tail -2 "$dir/err" | cut -c1-200)"
  fi
done

if [ $failures -gt 0 ]; then
  echo "text_probes: $failures failure(s)"
  exit 1
fi
echo "text_probes: all passed"
