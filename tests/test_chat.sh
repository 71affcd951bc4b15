#!/usr/bin/env bash
# `tinygpt chat` end to end: a character model trained here on short conversations ("u:red|" then "a:apple|") talks
# through a template file; the rendered prompt is checked by hand, replies end at the template's end of turn, repeat
# with a seed, and a turn answered from the KV cache equals the same turn answered with the history read whole;
# the window drops the oldest turns; sft teaches it other answers (eval --chat-data's loss falls); bad input is one
# error line; and on a pseudo-terminal the conversation takes turns, /reset, Ctrl-C at the prompt and Ctrl-C in the
# middle of a reply without ending the program. `quick` (for the sanitizer suite only, where training and decoding are
# tens of times slower) trains one iteration and checks the paths, not what a trained model learned.
#   tests/test_chat.sh path/to/tinygpt [full|quick]
set -uo pipefail
tinygpt=$1
mode=${2:-full}
full() { [ "$mode" = full ]; }
iters=300 sft_iters=150
full || iters=1 sft_iters=2
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

python3 - "$dir/conv.txt" <<'EOF'
import random, sys
random.seed(1)
pairs = [("red", "apple"), ("yellow", "banana"), ("green", "lime"), ("purple", "grape")]
with open(sys.argv[1], "w") as f:
    for _ in range(4000):
        u, a = random.choice(pairs)
        f.write(f"u:{u}|\na:{a}|\n")
EOF
printf '%s' "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}|
{% endfor %}{% if add_generation_prompt %}a:{% endif %}" > "$dir/short.jinja"

"$tinygpt" train --data "$dir/conv.txt" --out "$dir/run" --n-layer 2 --n-head 2 --n-embd 64 --block-size 64 \
  --batch-size 16 --max-iters $iters --lr-decay-iters 300 --warmup-iters 20 --lr 3e-3 --eval-interval 300 \
  --eval-iters 2 > "$dir/train.log" 2>&1 || fail "train exited $?: $(tail -3 "$dir/train.log")"
chat() { "$tinygpt" chat --ckpt "$dir/run" --chat-template "$dir/short.jinja" "$@"; }

# The prompt as the template renders it (lstrip/trim rules: the newline after endfor's tag is the text's own).
echo '[{"role": "system", "content": "be brief"}, {"role": "user", "content": "red"}]' > "$dir/m.json"
rendered=$(chat --messages "$dir/m.json" --message green --render-only; echo .)
[ "$rendered" = $'s:be brief|\nu:red|\nu:green|\na:.' ] || fail "--render-only printed '${rendered%.}'"
[ "$(chat --messages "$dir/m.json" --render-only --chat-template chatml)" = \
  $'<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nred<|im_end|>\n<|im_start|>assistant' ] \
  || fail "--chat-template chatml renders otherwise"

# Replies end at the end of turn ("|" here), one line each, the same for the same seed.
a=$(chat --message red --message green --temperature 0.8 --seed 3 2> "$dir/chat.log") || fail "chat exited $?: $(cat "$dir/chat.log")"
b=$(chat --message red --message green --temperature 0.8 --seed 3 2> /dev/null)
[ "$a" = "$b" ] || fail "the same seed gave other replies: '$a' vs '$b'"
if full; then
  [ "$(printf '%s\n' "$a" | wc -l)" = 2 ] || fail "two turns should give two lines, got '$a'"
  case "$a" in *'|'*|*'u:'*) fail "a reply holds the end-of-turn marker or the next turn: '$a'" ;; esac
  grep -q "reply cut" "$dir/chat.log" && fail "a reply did not end at the end of turn: $(cat "$dir/chat.log")"
fi
grep -q "template $dir/short.jinja, window 64 tokens" "$dir/chat.log" || fail "chat does not say its template and window"

# A turn from the cache equals the same turn with the history read whole (greedy; a trained model's replies are one
# line of plain letters each).
if full; then
  g=$(chat --message red --message green --temperature 0 2> /dev/null)
  first=$(printf '%s\n' "$g" | sed -n 1p)
  second=$(printf '%s\n' "$g" | sed -n 2p)
  printf '[{"role": "user", "content": "red"}, {"role": "assistant", "content": "%s"}]' "$first" > "$dir/h.json"
  [ "$(chat --messages "$dir/h.json" --message green --temperature 0 2> /dev/null)" = "$second" ] \
    || fail "the second turn read whole differs from the cached one ('$second')"
fi

# A window of 24 tokens holds about one turn: the oldest are dropped, and said so.
chat --context 24 --max-new-tokens 8 --message red --message green --message purple > /dev/null 2> "$dir/drop.log" \
  || fail "chat --context 24 exited non-zero: $(cat "$dir/drop.log")"
grep -Eq "dropped the [0-9]+ oldest messages to fit the window of 24 tokens" "$dir/drop.log" || fail "no drop said: $(cat "$dir/drop.log")"

# sft: the same model taught another answer for each colour (the loss on the replies only); eval --chat-data's loss
# falls, and the chat answers as taught.
python3 - "$dir/swap.jsonl" <<'EOF'
import json, random, sys
random.seed(3)
pairs = [("red", "lime"), ("yellow", "grape"), ("green", "apple"), ("purple", "banana")]
with open(sys.argv[1], "w") as f:
    for _ in range(200):
        u, a = random.choice(pairs)
        f.write(json.dumps({"messages": [{"role": "user", "content": u}, {"role": "assistant", "content": a}]}) + "\n")
EOF
"$tinygpt" sft --init-from "$dir/run" --data "$dir/swap.jsonl" --chat-template "$dir/short.jinja" --out "$dir/swap" \
  --lr 2e-3 --max-iters $sft_iters --lr-decay-iters 150 --eval-interval 75 > "$dir/sft.log" 2>&1 || fail "sft exited $?: $(tail -3 "$dir/sft.log")"
grep -q "data: 200 conversations (180 train, 20 held out)" "$dir/sft.log" || fail "sft's data line: $(grep data: "$dir/sft.log")"
grep -q "step $sft_iters: train loss [0-9.]*, val loss [0-9.]* (the assistants' [0-9]* held-out tokens)" "$dir/sft.log" || fail "sft's last evaluation is missing"
chat_eval() { "$tinygpt" eval --ckpt "$1" --chat-data "$dir/swap.jsonl" --chat-template "$dir/short.jinja" --batch-size 16; }
loss_of() { chat_eval "$1" | sed -n 's/^chat loss \([0-9.]*\) over \([0-9]*\) assistant tokens.*/\1 \2/p'; }
read -r before n_before <<< "$(loss_of "$dir/run")"
read -r after n_after <<< "$(loss_of "$dir/swap")"
[ -n "$before" ] && [ "$n_before" = "$n_after" ] && [ "$n_after" -gt 0 ] || fail "eval --chat-data printed '$(chat_eval "$dir/swap")'"
if full; then
  awk -v a="$after" -v b="$before" 'BEGIN {exit !(a < b / 4)}' || fail "sft did not lower the replies' loss: $before -> $after"
  taught=$(for c in red green purple yellow; do  # one conversation each, as it was taught
    "$tinygpt" chat --ckpt "$dir/swap" --chat-template "$dir/short.jinja" --temperature 0 --message $c 2> /dev/null; done | tr '\n' ' ')
  [ "$taught" = "lime apple banana grape " ] || fail "after sft the chat answers '$taught', not 'lime apple banana grape'"
fi
# sft with LoRA: the same lesson from adapters alone (rank 4 on every layer), the checkpoint holding only them.
"$tinygpt" sft --init-from "$dir/run" --data "$dir/swap.jsonl" --chat-template "$dir/short.jinja" --out "$dir/lora" \
  --lora-rank 4 --lora-targets q,k,v,o,up,down --lr 1e-2 --max-iters $sft_iters --lr-decay-iters 150 --eval-interval 75 \
  > "$dir/lora.log" 2>&1 || fail "sft --lora-rank exited $?: $(tail -3 "$dir/lora.log")"
grep -Eq "^LoRA: rank 4, alpha 8, on q,k,v,o,up,down of [0-9]+ blocks: .* the base frozen" "$dir/lora.log" \
  || fail "sft --lora-rank's LoRA line: $(grep -i lora "$dir/lora.log")"
[ "$(stat -c %s "$dir/lora/ckpt_latest.safetensors")" -lt "$(( $(stat -c %s "$dir/run/ckpt_latest.safetensors") / 4 ))" ] \
  || fail "the LoRA checkpoint is not much smaller than its base's: $(ls -l "$dir/lora" "$dir/run")"
read -r lora_loss n_lora <<< "$(loss_of "$dir/lora")"
[ "$n_lora" = "$n_before" ] || fail "eval --chat-data of the LoRA run printed '$(chat_eval "$dir/lora")'"
if full; then
  awk -v a="$lora_loss" -v b="$before" 'BEGIN {exit !(a < b / 4)}' || fail "LoRA did not lower the replies' loss: $before -> $lora_loss"
  taught=$(for c in red green purple yellow; do
    "$tinygpt" chat --ckpt "$dir/lora" --chat-template "$dir/short.jinja" --temperature 0 --message $c 2> /dev/null; done | tr '\n' ' ')
  [ "$taught" = "lime apple banana grape " ] || fail "after LoRA sft the chat answers '$taught', not 'lime apple banana grape'"
fi
# sft from a BPE trained here, without a chat template: ChatML, its two tokens added and the vocabulary grown by two rows.
for i in $(seq 100); do echo "red apple, green lime, purple grape and yellow banana"; done > "$dir/words.txt"
"$tinygpt" train --data "$dir/words.txt" --tokenizer bpe --vocab-size 300 --out "$dir/bpe" --n-layer 1 --n-head 2 \
  --n-embd 32 --block-size 32 --batch-size 4 --max-iters 1 --eval-interval 1 --eval-iters 1 > "$dir/bpe.log" 2>&1 \
  || fail "train (bpe) exited $?: $(tail -3 "$dir/bpe.log")"
"$tinygpt" sft --init-from "$dir/bpe" --data "$dir/swap.jsonl" --out "$dir/bpe-sft" --block-size 32 --max-iters 2 \
  --eval-interval 2 --eval-iters 1 > "$dir/bpe-sft.log" 2>&1 || fail "sft (bpe) exited $?: $(tail -3 "$dir/bpe-sft.log")"
n=$(sed -n 's/^ChatML for this model: <|im_start|> and <|im_end|> added to its tokenizer (ids from \([0-9]*\)).*/\1/p' "$dir/bpe-sft.log")
[ -n "$n" ] && grep -q "its vocabulary $((n + 2)) rows" "$dir/bpe-sft.log" || fail "sft did not add ChatML's tokens: $(grep -i chatml "$dir/bpe-sft.log")"
"$tinygpt" info --ckpt "$dir/bpe-sft" | grep -q "vocabulary $((n + 2)) (byte-level BPE)" || fail "info: $("$tinygpt" info --ckpt "$dir/bpe-sft" | sed -n 2p)"
[ "$("$tinygpt" tokenizer encode --ckpt "$dir/bpe-sft" --text "<|im_end|>")" = "$((n + 1))" ] || fail "<|im_end|> is not token $((n + 1))"
out=$("$tinygpt" chat --ckpt "$dir/bpe-sft" --message red --max-new-tokens 4 2>&1 > /dev/null)
[[ "$out" == *"template of the model"* ]] || fail "the sft run does not carry ChatML as its template: $out"
printf '{"messages": [{"role": "user", "content": "red"}]}\n{"messages": 3}\n' > "$dir/bad.jsonl"

expect_error() {  # expect_error STATUS MESSAGE command...
  local status=$1 want=$2
  shift 2
  local out
  out=$("$@" 2>&1 > /dev/null)
  local got=$?
  [ "$got" = "$status" ] || fail "$* exited $got, expected $status: $out"
  [ "$(printf '%s\n' "$out" | grep -c '^error: ')" = 1 ] && [[ "$out" == *"$want"* ]] || fail "$*: expected one error line with '$want', got '$out'"
}
echo '[{"role": "user"}]' > "$dir/bad.json"
echo '{{ x | wordwrap }}' > "$dir/bad.jinja"
expect_error 1 'message 0 must be an object with a string "role" and a string "content"' chat --messages "$dir/bad.json" --render-only
expect_error 1 "is not JSON" chat --messages "$dir/conv.txt" --render-only
expect_error 1 "not a built-in template (chatml, llama3)" "$tinygpt" chat --ckpt "$dir/run" --chat-template "$dir/none.jinja" --render-only
expect_error 1 "line 1: the filter 'wordwrap' is not one tinygpt's template reader knows" chat --chat-template "$dir/bad.jinja" --render-only
expect_error 2 "--max-new-tokens must be positive" chat --max-new-tokens 0 --message red
expect_error 2 "--temperature must not be negative" chat --temperature -1 --message red
expect_error 1 'bad.jsonl:2: "messages" must be a JSON array' "$tinygpt" sft --init-from "$dir/run" --data "$dir/bad.jsonl" --out "$dir/s2"
expect_error 2 "sft fine-tunes a model on conversations: give --init-from" "$tinygpt" sft --data "$dir/swap.jsonl" --out "$dir/s2"
expect_error 2 "eval reads --data (text) or --chat-data (conversations): give one" "$tinygpt" eval --ckpt "$dir/run"
expect_error 2 "--lora-rank adapts a trained model, which stays frozen: give --init-from" "$tinygpt" train --data "$dir/words.txt" --lora-rank 2 --out "$dir/s2"
expect_error 2 "LoRA target 'fc' is not one of q, k, v, o, gate, up, down" "$tinygpt" sft --init-from "$dir/run" --data "$dir/swap.jsonl" --lora-rank 2 --lora-targets q,fc --out "$dir/s2"
expect_error 2 "the LoRA target gate needs the SwiGLU MLP" "$tinygpt" sft --init-from "$dir/run" --data "$dir/swap.jsonl" --lora-rank 2 --lora-targets gate --out "$dir/s2"
expect_error 1 "which a frozen embedding cannot learn" "$tinygpt" sft --init-from "$dir/bpe" --data "$dir/swap.jsonl" --lora-rank 2 --block-size 32 --out "$dir/s3"
cp -r "$dir/run" "$dir/moved-base"
"$tinygpt" train --data "$dir/conv.txt" --init-from "$dir/moved-base" --lora-rank 2 --out "$dir/lora2" --max-iters 1 \
  --eval-interval 1 --eval-iters 1 --batch-size 2 > "$dir/lora2.log" 2>&1 || fail "train --lora-rank exited $?: $(tail -2 "$dir/lora2.log")"
rm -r "$dir/moved-base"
expect_error 1 "a LoRA checkpoint holds only its adapters, so it needs the base it was trained on" chat --ckpt "$dir/lora2" --message red
expect_error 1 "fit the window of 64 tokens" chat --message "$(printf 'red%.0s' $(seq 40))"

# On a pseudo-terminal: a turn, /reset, Ctrl-C at the prompt, and Ctrl-C in the middle of a long reply (an untrained
# wide model over ChatML, which never ends its turn by chance; Ctrl-C once 50 bytes of echo and reply are out, not after a set
# time, which a fast machine's 900 tokens outran) leave the chat running; /exit ends it with status 0.
for i in $(seq 200); do printf '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nhello there<|im_end|>\n'; done > "$dir/chatml.txt"
wide=(--n-layer 4 --n-head 4 --n-embd 256)  # slow enough to stop mid-reply; under the sanitizers a small one is
full || wide=(--n-layer 1 --n-head 2 --n-embd 64)
"$tinygpt" train --data "$dir/chatml.txt" --out "$dir/wide" "${wide[@]}" --block-size 1024 \
  --batch-size 1 --max-iters 1 --eval-interval 1 --eval-iters 1 > "$dir/wide.log" 2>&1 || fail "train (wide) exited $?: $(tail -3 "$dir/wide.log")"
python3 - "$tinygpt" "$dir" <<'EOF' || fail "the chat on a pseudo-terminal: see above"
import os, pty, select, sys, time
tinygpt, d = sys.argv[1], sys.argv[2]
try:  # a machine without pseudo-terminals (a container without /dev/ptmx) skips this part, saying so
    os.close(os.openpty()[0])
except OSError as e:
    print(f"pty: skipped, no pseudo-terminal here ({e})")
    sys.exit(0)

def talk(args, steps):
    pid, fd = pty.fork()
    if pid == 0:
        os.execv(tinygpt, [tinygpt, "chat"] + args)
    seen = b""
    def until(pattern, mark, timeout=30):  # pattern: bytes to see, or a count of new bytes
        nonlocal seen
        end = time.time() + timeout
        while (len(seen) - mark < pattern) if isinstance(pattern, int) else (pattern not in seen[mark:]):
            r, _, _ = select.select([fd], [], [], max(0, end - time.time()))
            if not r:
                raise SystemExit(f"no {pattern!r} within {timeout} s; the terminal showed {seen[-600:]!r}")
            try:
                seen += os.read(fd, 4096)
            except OSError:
                raise SystemExit(f"the chat ended before {pattern!r}; the terminal showed {seen[-600:]!r}")
    for send, expect in steps:
        mark = len(seen)
        if isinstance(send, float):
            time.sleep(send)
        elif send:
            os.write(fd, send)
        if expect:
            until(expect, mark)
    _, status = os.waitpid(pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"chat exited {os.waitstatus_to_exitcode(status)}; the terminal showed {seen[-600:]!r}")
    return seen

talk(["--ckpt", f"{d}/run", "--chat-template", f"{d}/short.jinja", "--temperature", "0"],
     [(None, b"Ctrl-D the chat\r\n> "), (b"red\n", b"\r\n> "), (b"/reset\n", b"[a new conversation]\r\n> "),
      (b"\x03", b"\r\n> "), (b"green\n", b"\r\n> "), (b"/exit\n", None)])
out = talk(["--ckpt", f"{d}/wide", "--max-new-tokens", "900"],
           [(None, b"the chat\r\n> "), (b"hi\n", 50), (b"\x03", b"[reply stopped]\r\n> "),
            (b"\x04", None)])
print("pty: turns, /reset, Ctrl-C at the prompt and in a reply: ok")
EOF

if [ "$failures" -gt 0 ]; then
  echo "test_chat: $failures failure(s)"
  exit 1
fi
echo "test_chat: all checks passed"
