#!/usr/bin/env bash
# SFT on a synthetic task, held-out prompts scored: a small BPE model is pretrained on tiny Shakespeare, then `tinygpt
# sft` teaches it one pattern from 400 conversations ("<filler words>. What colour is the <thing>?" -> "The <thing> is
# <colour>.", 8 things, filler drawn from 3,000 words of the text), and 100 held-out prompts whose filler comes from
# 3,000 other words are answered greedily by `tinygpt chat --message`; a reply is right when it is the whole answer.
#   bench/sft_synthetic.sh [build dir] [text] [work dir]
set -euo pipefail
build=${1:-build}
text=${2:-../shared/data/tinyshakespeare.txt}
work=${3:-$(mktemp -d)}
tinygpt=$build/tinygpt
mkdir -p "$work"
echo "work dir $work; $("$tinygpt" --version); $(nproc) threads"

python3 - "$text" "$work" <<'EOF'
import json, random, re, sys
random.seed(7)
words = sorted(set(w.lower() for w in re.findall(r"[A-Za-z]{3,8}", open(sys.argv[1]).read())))
random.shuffle(words)
train_words, test_words = words[:3000], words[3000:6000]
colours = {"apple": "red", "banana": "yellow", "lime": "green", "grape": "purple", "sky": "blue", "snow": "white",
           "coal": "black", "orange": "orange"}
def conversation(pool):
    thing = random.choice(list(colours))
    filler = " ".join(random.choice(pool) for _ in range(random.randint(2, 6)))
    return {"messages": [{"role": "user", "content": f"{filler}. What colour is the {thing}?"},
                         {"role": "assistant", "content": f"The {thing} is {colours[thing]}."}]}
for name, pool, n in (("train.jsonl", train_words, 400), ("test.jsonl", test_words, 100)):
    with open(f"{sys.argv[2]}/{name}", "w") as f:
        for _ in range(n):
            f.write(json.dumps(conversation(pool)) + "\n")
EOF

start=$(date +%s)
"$tinygpt" train --data "$text" --tokenizer bpe --vocab-size 512 --out "$work/base" --n-layer 4 --n-head 4 --n-embd 128 \
  --block-size 128 --batch-size 16 --max-iters 600 --lr 2e-3 --lr-decay-iters 600 --dropout 0 --eval-interval 600 \
  --eval-iters 5 --log-interval 600 2>&1 | grep -E "^step 600|^done"
"$tinygpt" sft --init-from "$work/base" --data "$work/train.jsonl" --out "$work/sft" --lr 2e-3 --max-iters 300 \
  --lr-decay-iters 300 --eval-interval 300 --log-interval 300 2>&1 | grep -E "^data|^step|^done"
"$tinygpt" eval --ckpt "$work/base" --chat-data "$work/test.jsonl" --batch-size 16 | sed 's/^/before sft, held out: /'
"$tinygpt" eval --ckpt "$work/sft" --chat-data "$work/test.jsonl" --batch-size 16 | sed 's/^/after sft, held out: /'
python3 - "$tinygpt" "$work" <<'EOF'
import json, subprocess, sys
tinygpt, work = sys.argv[1], sys.argv[2]
right = total = 0
for line in open(f"{work}/test.jsonl"):
    m = json.loads(line)["messages"]
    reply = subprocess.run([tinygpt, "chat", "--ckpt", f"{work}/sft", "--message", m[0]["content"], "--temperature", "0"],
                           capture_output=True, text=True, check=True).stdout.strip()
    total += 1
    right += reply == m[1]["content"]
print(f"held-out prompts answered right: {right} / {total}")
EOF
echo "in all $(( $(date +%s) - start )) s"
