#!/usr/bin/env python3
"""`tinygpt serve` over loopback with a real HTTP client (Python's http.client): models, health and the page; chat
and text completions, streamed and not (a greedy reply equal to `tinygpt chat --message`'s, the streamed pieces
joined equal to the whole); over 200 malformed or hostile requests each answered with a 4xx and an OpenAI error object,
the server answering normally after; 16 streaming clients at once; 8 clients that drop mid-stream, their places
freed; SIGTERM during a stream (it finishes, the server exits 0); a LoRA run served merged.
  tests/test_serve.py path/to/tinygpt [full|quick]   (quick: untrained models, for the sanitizer builds)"""
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_fixture  # noqa: E402
from serve_fixture import Server  # noqa: E402

TINYGPT = sys.argv[1]
FULL = (sys.argv[2] if len(sys.argv) > 2 else "full") == "full"
KEY = "test-key"
failures = []


def fail(message):
    print("FAIL:", message, flush=True)
    failures.append(message)


def check(ok, message):
    if not ok:
        fail(message)
    return ok


def call(server, method, path, body=None, headers=None, timeout=60):
    """(status, headers, body bytes) of one request on a fresh connection."""
    c = http.client.HTTPConnection("127.0.0.1", server.port, timeout=timeout)
    h = {"Authorization": f"Bearer {KEY}"}
    h.update(headers or {})
    if isinstance(body, (dict, list)):
        body = json.dumps(body)
        h.setdefault("Content-Type", "application/json")
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, dict(r.getheaders()), data


def post(server, path, body, **kw):
    status, _, data = call(server, "POST", path, body, **kw)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, {"unparsed": data[:200].decode("utf-8", "replace")}


def stream(server, path, body, timeout=120):
    """The data lines of a streamed answer, as parsed JSON (and the string '[DONE]')."""
    status, headers, data = call(server, "POST", path, dict(body, stream=True), timeout=timeout)
    events = []
    for block in data.decode("utf-8").split("\n\n"):
        if block.startswith("data: "):
            events.append("[DONE]" if block == "data: [DONE]" else json.loads(block[6:]))
    return status, headers, events


def joined(events, chat=True):
    return "".join((e["choices"][0]["delta"].get("content", "") if chat else e["choices"][0]["text"])
                   for e in events if isinstance(e, dict) and e.get("choices"))


def run(*args):
    return subprocess.run([TINYGPT, *args], capture_output=True, text=True)


def is_error(status, body, want_status=None):
    ok = 400 <= status < 500 and isinstance(body, dict) and isinstance(body.get("error"), dict) \
        and isinstance(body["error"].get("message"), str) and isinstance(body["error"].get("type"), str)
    return ok and (want_status is None or status == want_status)


def main():
    tmp = tempfile.mkdtemp()
    template = serve_fixture.colour_model(TINYGPT, tmp, f"{tmp}/run", 300 if FULL else 1)

    s = Server(TINYGPT, "--ckpt", f"{tmp}/run", "--chat-template", template, "--api-key", KEY, "--max-body", "65536",
               "--model-name", "colours")
    try:
        basics(s, tmp, template)
        hostile(s)
        load(s)
    finally:
        code = s.stop()
        check(code == 0, f"serve exited {code} after SIGTERM: {s.log()}")
    lora(tmp)
    slow(tmp, template)
    if failures:
        print(f"test_serve: {len(failures)} failure(s)")
        sys.exit(1)
    print("test_serve: all passed")


def basics(s, tmp, template):
    status, _, data = call(s, "GET", "/health")
    check(status == 200 and json.loads(data) == {"status": "ok"}, f"/health: {status} {data[:200]}")
    status, _, data = call(s, "GET", "/")
    check(status == 200 and b"<title>tinygpt chat</title>" in data, f"the page at /: {status} {data[:100]}")
    status, _, data = call(s, "GET", "/v1/models")
    models = json.loads(data)
    check(status == 200 and [m["id"] for m in models["data"]] == ["colours"], f"/v1/models: {status} {data[:200]}")
    status, _, data = call(s, "GET", "/v1/models/colours")
    check(status == 200 and json.loads(data)["id"] == "colours", f"/v1/models/colours: {status} {data[:200]}")

    # A greedy reply equals `tinygpt chat --message`'s; streamed, its pieces joined equal it.
    ask = {"model": "colours", "messages": [{"role": "user", "content": "red"}], "temperature": 0}
    status, body = post(s, "/v1/chat/completions", ask)
    if not check(status == 200, f"chat completion: {status} {body}"):
        return
    reply = body["choices"][0]["message"]["content"]
    chat = run("chat", "--ckpt", f"{tmp}/run", "--chat-template", template, "--message", "red", "--temperature", "0")
    check(chat.returncode == 0 and chat.stdout == reply + "\n",
          f"serve's greedy reply '{reply}' is not chat's '{chat.stdout.rstrip()}'")
    check(body["object"] == "chat.completion" and body["choices"][0]["finish_reason"] in ("stop", "length"),
          f"the chat completion's fields: {body}")
    u = body["usage"]
    check(u["prompt_tokens"] == len("u:red|\na:") and u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"],
          f"usage: {u}")
    if FULL:
        check(reply == "apple" and body["choices"][0]["finish_reason"] == "stop",
              f"a trained model answers red with '{reply}' ({body['choices'][0]['finish_reason']})")
    status, headers, events = stream(s, "/v1/chat/completions", dict(ask, stream_options={"include_usage": True}))
    check(status == 200 and headers.get("Content-Type", "").startswith("text/event-stream"), f"stream: {status} {headers}")
    check(events and events[-1] == "[DONE]", f"the stream does not end with [DONE]: {events[-2:]}")
    check(joined(events) == reply, f"the streamed pieces '{joined(events)}' are not the reply '{reply}'")
    chunks = [e for e in events if isinstance(e, dict)]
    check(chunks[0]["choices"][0]["delta"].get("role") == "assistant", f"the first chunk has no role: {chunks[0]}")
    check(chunks[-2]["choices"][0]["finish_reason"] == body["choices"][0]["finish_reason"],
          f"the last chunk's finish_reason: {chunks[-2]}")
    check(chunks[-1]["choices"] == [] and chunks[-1]["usage"] == body["usage"], f"the usage chunk: {chunks[-1]}")

    # Text completions: raw text, a stop string, max_tokens, the same seed the same text.
    status, body = post(s, "/v1/completions", {"prompt": "u:green|\na:", "temperature": 0, "max_tokens": 30})
    check(status == 200 and body["object"] == "text_completion", f"completion: {status} {body}")
    if FULL:
        check(body["choices"][0]["text"].startswith("lime|"), f"the completion of green: {body}")
        status, body = post(s, "/v1/completions", {"prompt": "u:green|\na:", "temperature": 0, "stop": "|"})
        check(body["choices"][0]["text"] == "lime" and body["choices"][0]["finish_reason"] == "stop",
              f"a stop string: {body}")
    status, body = post(s, "/v1/completions", {"prompt": "u:", "max_tokens": 5})
    check(status == 200 and body["usage"]["completion_tokens"] == 5 and body["choices"][0]["finish_reason"] == "length",
          f"max_tokens 5: {body}")
    seeded = [post(s, "/v1/completions", {"prompt": "u:", "max_tokens": 20, "seed": 7, "temperature": 1.2})[1]
              for _ in range(2)]
    check(seeded[0]["choices"][0]["text"] == seeded[1]["choices"][0]["text"], f"the same seed differs: {seeded}")
    status, _, events = stream(s, "/v1/completions", {"prompt": "u:", "max_tokens": 6, "seed": 7, "temperature": 1.2})
    check(status == 200 and events[-1] == "[DONE]", f"a streamed completion: {status} {events[-2:]}")
    status, body = post(s, "/v1/completions", {"prompt": "u:", "max_tokens": 6, "seed": 7, "temperature": 1.2})
    check(joined(events, chat=False) == body["choices"][0]["text"], "a streamed completion differs from the whole")


def hostile(s):
    """Over 200 requests that must each get a 4xx with an error object; the server answers normally after."""
    good = {"model": "colours", "messages": [{"role": "user", "content": "red"}], "max_tokens": 4}
    good_text = {"model": "colours", "prompt": "u:red", "max_tokens": 4}
    bad_values = {
        "model": [3, "another-model", [], {}],
        "max_tokens": [0, -5, "10", 1.5, 2 ** 31, True, [4]],
        "max_completion_tokens": [0, "x", -1],
        "temperature": [-0.1, 2.5, "hot", [1], {}],
        "top_p": [-1, 1.5, "x", True],
        "top_k": [-1, "x", 1.5, 2 ** 64],
        "n": [2, 0, "1", 1.5],
        "seed": ["x", 1.5, 2 ** 70, -(2 ** 64), [1]],
        "stop": [["a", "b", "c", "d", "e"], "", 123, [1], ["x" * 300], {"a": 1}],
        "stream": ["yes", 1, [], {}],
        "stream_options": ["x", {"include_usage": "yes"}, 3],
        "frequency_penalty": [1, 0.5],
        "presence_penalty": [2],
        "logprobs": [True],
        "tools": [[{"type": "function", "function": {"name": "f"}}]],
        "response_format": [{"type": "json_object"}, "json"],
        "logit_bias": [{"1": 5}],
    }
    bad_messages = [3, "red", [], [3], [{"role": "user"}], [{"content": "x"}], [{"role": 5, "content": "x"}],
                    [{"role": "tool", "content": "x"}], [{"role": "user", "content": 5}],
                    [{"role": "user", "content": None}], [{"role": "user", "content": [{"type": "image_url"}]}],
                    [{"role": "user", "content": [{"type": "text"}]}], [{"role": "user", "content": "Z"}],
                    [{"role": "user", "content": "red"}] * 2000, [{"role": "user", "content": "red" * 40}]]
    bad_prompts = [5, [1, 2, 3], ["a", "b"], [], None, "", {"text": "x"}, "Z", "u:" * 60, [["u:"]], True, "r\u00e9d",
                   "\ud83d\ude00"]
    cases = []  # (path, body or raw bytes, the status wanted or None for any 4xx)
    for base, path in ((good, "/v1/chat/completions"), (good_text, "/v1/completions")):
        for key, values in bad_values.items():
            for v in values:
                cases.append((path, dict(base, **{key: v}), 404 if v == "another-model" else 400))
    for m in bad_messages:
        cases.append(("/v1/chat/completions", dict(good, messages=m), None))
    cases.append(("/v1/chat/completions", {k: v for k, v in good.items() if k != "messages"}, 400))
    for p in bad_prompts:
        cases.append(("/v1/completions", dict(good_text, prompt=p), 400))
    cases.append(("/v1/completions", {k: v for k, v in good_text.items() if k != "prompt"}, 400))
    raw = [b"", b"{", b"[1,", b"nul", b"\xff\xfe", b'{"messages": "\xff"}', b"[]", b"3", b'"x"', b"null",
           b'{"messages": [{"role": "user", "content": "\\ud800"}]}', b"[" * 60000, b'{"a":' * 20000,
           b"{" + b'"k": 1,' * 5000 + b"}", json.dumps(good).encode()[:-1], b"true", b"1e999", b"\xef\xbb\xbf{}",
           b'{"prompt": "\\u0000", "messages": [{"role": "user", "content": "\\u0000"}]}', b"{'a': 1}",
           b'{"max_tokens": 1e400}', b'{"messages": [{"role": "user", "content": "red"}], "max_tokens": 5' + b" " * 100]
    for body in raw:
        for path in ("/v1/chat/completions", "/v1/completions"):
            cases.append((path, body, None))
    for path in ("/v1/chat/completions", "/v1/completions"):
        cases.append((path, b"x" * 70000, 413))
    answered = 0
    for path, body, want in cases:
        status, answer = post(s, path, body)
        if check(is_error(status, answer, want), f"POST {path} {str(body)[:120]}: {status} {str(answer)[:200]} "
                                                 f"(wanted {want or '4xx'} with an error object)"):
            answered += 1
    # Routes, methods, keys, and what is not HTTP at all.
    others = [("GET", "/v1/chat/completions", None, {}, 404), ("DELETE", "/v1/models", None, {}, 404),
              ("GET", "/v2/models", None, {}, 404), ("GET", "/v1/models/another", None, {}, 404),
              ("POST", "/v1/models", b"{}", {}, 404), ("GET", "/v1/models", None, {"Authorization": "Bearer no"}, 401),
              ("GET", "/v1/models", None, {"Authorization": ""}, 401),
              ("POST", "/v1/chat/completions", json.dumps(good), {"Authorization": "Basic x"}, 401),
              ("POST", "/v1/completions", json.dumps(good_text), {"Authorization": f"Bearer {KEY}x"}, 401)]
    for method, path, body, headers, want in others:
        status, _, data = call(s, method, path, body, headers)
        try:
            answer = json.loads(data)
        except ValueError:
            answer = data[:100]
        if check(is_error(status, answer, want), f"{method} {path} {headers}: {status} {answer} (wanted {want})"):
            answered += 1
    for junk in (b"GARBAGE\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nContent-Length: 99999999999999999999\r\n\r\n", b"\x00" * 64 + b"\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            c.sendall(junk)
            c.shutdown(socket.SHUT_WR)
            reply = b""
            try:
                while chunk := c.recv(4096):
                    reply += chunk
            except OSError:
                pass
        status = int(reply.split(b" ")[1]) if reply.startswith(b"HTTP/1.1 ") else 0
        if check(status == 0 or 400 <= status < 500, f"junk {junk[:40]}: {reply[:100]}"):
            answered += 1
    check(answered >= 200, f"only {answered} hostile requests answered as they should ({len(cases) + len(others) + 4} sent)")
    status, body = post(s, "/v1/chat/completions", good)
    check(status == 200 and body["choices"][0]["message"]["content"] is not None,
          f"after the hostile requests the server answers {status} {body}")
    print(f"test_serve: {answered} hostile requests answered with a 4xx and an error object", flush=True)


def load(s):
    """16 streaming clients at once all finish."""
    results = [None] * 16

    def client(k):
        t0 = time.monotonic()
        try:
            status, _, events = stream(s, "/v1/chat/completions", {
                "messages": [{"role": "user", "content": ["red", "green", "yellow", "purple"][k % 4]}],
                "max_tokens": 24, "temperature": 0.8, "seed": k})
            results[k] = (status, events, time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001 - a client that failed is a result to report
            results[k] = (0, [repr(e)], time.monotonic() - t0)

    threads = [threading.Thread(target=client, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    done = [r for r in results if r and r[0] == 200 and r[1] and r[1][-1] == "[DONE]"
            and r[1][-2]["choices"][0]["finish_reason"] in ("stop", "length")]
    check(len(done) == 16, f"of 16 streaming clients {len(done)} finished: {[r and r[1][-1:] for r in results]}")


def lora(tmp):
    """A LoRA run (its checkpoint holds only the adapters) is served merged: its greedy text is `sample`'s."""
    t = run("train", "--data", f"{tmp}/conv.txt", "--init-from", f"{tmp}/run", "--out", f"{tmp}/lora", "--lora-rank", "2",
            "--max-iters", "20" if FULL else "1", "--eval-interval", "20", "--eval-iters", "1", "--batch-size", "8")
    if not check(t.returncode == 0, f"train --lora-rank exited {t.returncode}: {t.stderr[-300:]}"):
        return
    s = Server(TINYGPT, "--ckpt", f"{tmp}/lora", "--api-key", KEY)
    try:
        status, body = post(s, "/v1/completions", {"prompt": "u:red|\na:", "max_tokens": 8, "temperature": 0})
        sample = run("sample", "--ckpt", f"{tmp}/lora", "--prompt", "u:red|\na:", "--max-new-tokens", "8",
                     "--temperature", "0")
        check(status == 200 and sample.stdout == "u:red|\na:" + body["choices"][0]["text"] + "\n",
              f"the LoRA run served: {status} {body}, sample: {sample.stdout!r}")
    finally:
        s.stop()


def slow(tmp, template):
    """A model slow enough to drop clients mid-stream (untrained, 4 x 256 wide, a window of 512) and to be stopped."""
    t = run("train", "--data", f"{tmp}/conv.txt", "--out", f"{tmp}/slow", "--n-layer", "4", "--n-head", "4",
            "--n-embd", "256", "--block-size", "512", "--batch-size", "1", "--max-iters", "1", "--eval-interval", "1",
            "--eval-iters", "1")
    if not check(t.returncode == 0, f"train (slow) exited {t.returncode}: {t.stderr[-300:]}"):
        return
    s = Server(TINYGPT, "--ckpt", f"{tmp}/slow", "--chat-template", template, "--api-key", KEY, "--max-queue", "8")
    try:
        # 8 clients each read their first piece (or a waiting comment) and hang up.
        def dropper():
            body = json.dumps({"prompt": "u:", "max_tokens": 400, "stream": True, "temperature": 1}).encode()
            with socket.create_connection(("127.0.0.1", s.port), timeout=60) as c:
                c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
                          b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() +
                          b"\r\n\r\n" + body)
                seen = b""
                while b"data: " not in seen and b": waiting" not in seen:
                    chunk = c.recv(4096)
                    if not chunk:
                        break
                    seen += chunk
        droppers = [threading.Thread(target=dropper) for _ in range(8)]
        for d in droppers:
            d.start()
        for d in droppers:
            d.join(60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and sum("went away" in line for line in s.lines) < 8:
            time.sleep(0.1)
        gone = [line for line in s.lines if "went away" in line]
        check(len(gone) == 8, f"of 8 clients that hung up, {len(gone)} were seen gone: {s.log()}")
        cut = [int(m.group(1)) for line in gone if (m := re.search(r"after (\d+) tokens", line))]
        check(all(n < 400 for n in cut), f"a dropped client's reply ran to its end: {gone}")
        # Their places are free: a queue of 8 takes 8 more at once (each short), none refused.
        codes = []

        def short():
            codes.append(post(s, "/v1/completions", {"prompt": "u:", "max_tokens": 2})[0])
        shorts = [threading.Thread(target=short) for _ in range(8)]
        for x in shorts:
            x.start()
        for x in shorts:
            x.join(120)
        check(codes == [200] * 8, f"after the drops, 8 requests were answered {codes}")

        # SIGTERM during a stream: it finishes, new connections are refused, the server exits 0.
        box = {}

        def long_stream():
            box["answer"] = stream(s, "/v1/completions", {"prompt": "u:", "max_tokens": 300, "temperature": 1,
                                                          "stream_options": {"include_usage": True}})
        x = threading.Thread(target=long_stream)
        x.start()
        time.sleep(0.3)  # the stream has begun (300 tokens take longer)
        s.proc.send_signal(signal.SIGTERM)
        x.join(120)
        try:
            code = s.proc.wait(60)
        except subprocess.TimeoutExpired:
            code = "hung"
        s.reader.join(5)
        status, _, events = box.get("answer", (0, None, []))
        check(status == 200 and events and events[-1] == "[DONE]", f"the stream in flight at SIGTERM: {status} {events[-2:]}")
        chunks = [e for e in events if isinstance(e, dict)]
        # (A chunk may carry several tokens' text: the pieces drawn while the last one was being sent.)
        check(len(chunks) >= 2 and chunks[-2]["choices"][0]["finish_reason"] == "length"
              and chunks[-1].get("usage", {}).get("completion_tokens") == 300,
              f"the stream in flight was not finished: {len(chunks)} chunks, the last {chunks[-2:]}")
        check(code == 0 and any(line == "stopped" for line in s.lines), f"serve after SIGTERM: exit {code}, {s.log()}")
    finally:
        s.stop(signal.SIGKILL)


if __name__ == "__main__":
    main()
