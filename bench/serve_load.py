#!/usr/bin/env python3
"""Load on `tinygpt serve`: N streaming clients at once on /v1/completions (a prompt, max_tokens each, sampled at
temperature 0.8 with a seed a client), after one client alone. Prints, over ROUNDS rounds, min/median/max of: the time
to the first token (one client alone, and each of N at once), the aggregate tokens per second of N at once, and one
client's rate alone. Requests are queued (one draws at a time), so the aggregate is about one client's rate and the
time to first token grows with a client's place in the queue.
  bench/serve_load.py --tinygpt build/tinygpt --ckpt RUN [--clients 16] [--max-tokens 64] [--rounds 3]
                      [--prompt TEXT] [--threads N]"""
import argparse
import http.client
import json
import re
import statistics
import subprocess
import threading
import time

p = argparse.ArgumentParser()
p.add_argument("--tinygpt", default="build/tinygpt")
p.add_argument("--ckpt", required=True)
p.add_argument("--clients", type=int, default=16)
p.add_argument("--max-tokens", type=int, default=64)
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--prompt", default="ROMEO:")
p.add_argument("--threads", type=int, default=0)
a = p.parse_args()

cmd = [a.tinygpt] + (["--threads", str(a.threads)] if a.threads else []) + \
    ["serve", "--ckpt", a.ckpt, "--port", "0", "--max-queue", str(a.clients)]
server = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
port = None
for line in server.stderr:
    print("serve:", line.rstrip())
    if m := re.search(r"listening on http://127\.0\.0\.1:(\d+)", line):
        port = int(m.group(1))
        break
log = []
threading.Thread(target=lambda: [log.append(x) for x in server.stderr], daemon=True).start()


def client(seed, out):
    """One streamed completion: (seconds to the first piece, seconds in all, tokens)."""
    t0 = time.perf_counter()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", json.dumps({
        "prompt": a.prompt, "max_tokens": a.max_tokens, "temperature": 0.8, "seed": seed, "stream": True,
        "stream_options": {"include_usage": True}}), {"Content-Type": "application/json"})
    r = c.getresponse()
    first, tokens = None, 0
    for raw in r:
        line = raw.decode().strip()
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        j = json.loads(line[6:])
        if j.get("choices") and j["choices"][0].get("text") and first is None:
            first = time.perf_counter() - t0
        if j.get("usage"):
            tokens = j["usage"]["completion_tokens"]
    out.append((first if first is not None else float("nan"), time.perf_counter() - t0, tokens))


def summary(xs, unit, digits=1):
    return f"{min(xs):.{digits}f} / {statistics.median(xs):.{digits}f} / {max(xs):.{digits}f} {unit}"


try:
    client(0, [])  # warm-up
    alone_ttft, alone_rate, many_ttft, many_rate, many_max_ttft = [], [], [], [], []
    for r in range(a.rounds):
        solo = []
        client(1000 + r, solo)
        alone_ttft.append(solo[0][0] * 1000)
        alone_rate.append(solo[0][2] / solo[0][1])
        results = []
        threads = [threading.Thread(target=client, args=(k, results)) for k in range(a.clients)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - t0
        done = [x for x in results if x[2] == a.max_tokens]
        if len(done) != a.clients:
            print(f"round {r}: only {len(done)} of {a.clients} clients got {a.max_tokens} tokens")
        many_ttft += [x[0] * 1000 for x in results]
        many_max_ttft.append(max(x[0] for x in results) * 1000)
        many_rate.append(sum(x[2] for x in results) / wall)
    print(f"\n{a.clients} streaming clients at once, {a.max_tokens} tokens each, {a.rounds} rounds "
          f"(min / median / max):")
    print("| measure | value |\n|---|---|")
    print(f"| one client alone: time to first token | {summary(alone_ttft, 'ms')} |")
    print(f"| one client alone: tokens/s | {summary(alone_rate, 'tokens/s')} |")
    print(f"| {a.clients} at once: time to first token, every client | {summary(many_ttft, 'ms', 0)} |")
    print(f"| {a.clients} at once: the last client's first token | {summary(many_max_ttft, 'ms', 0)} |")
    print(f"| {a.clients} at once: aggregate tokens/s | {summary(many_rate, 'tokens/s')} |")
finally:
    server.terminate()
    server.wait(60)
