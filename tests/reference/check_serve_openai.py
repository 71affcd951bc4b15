"""Checks `tinygpt serve` with the `openai` Python client, as editors and agent frameworks reach a local model: the
models list; chat and text completions, streamed and not; at temperature 0 the chat reply equals `tinygpt chat
--message` of the same conversation and the streamed pieces joined equal the whole; the client's own exceptions for a
wrong key (AuthenticationError), an unknown model (NotFoundError) and a bad value (BadRequestError). The model is one
trained here to answer colours with fruit (its replies end at its template's end of turn).

Run by developers, not by CI (the client is installed outside the source tree):

  python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install openai
  /tmp/venv-hf/bin/python tests/reference/check_serve_openai.py [--build build]

Exit status: 0 all checks pass, 1 a check fails or a tinygpt command errs, 77 the openai package is missing.
"""
import argparse
import json
import pathlib
import subprocess
import sys
import tempfile

try:
    import openai
except ImportError:
    print("skipped: openai is not installed (python3 -m venv /tmp/venv-hf && /tmp/venv-hf/bin/pip install openai)")
    sys.exit(77)

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
import serve_fixture  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--build", default="build", help="the build directory holding tinygpt")
tinygpt = f"{parser.parse_args().build}/tinygpt"
failures = []


def check(ok, message, detail=""):
    print(("ok   " if ok else "FAIL ") + message + (f": {detail}" if detail and not ok else ""), flush=True)
    if not ok:
        failures.append(message)


tmp = tempfile.mkdtemp()
template = serve_fixture.colour_model(tinygpt, tmp, f"{tmp}/colours")
server = serve_fixture.Server(tinygpt, "--ckpt", f"{tmp}/colours", "--chat-template", template, "--api-key",
                              "sk-local")
port = server.port
print(f"openai {openai.__version__} against tinygpt serve on port {port}")
client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-local", max_retries=0)
try:
    ids = [m.id for m in client.models.list()]
    check(ids == ["colours"], "models.list() names the run", str(ids))
    history = [{"role": "user", "content": "red"}, {"role": "assistant", "content": "apple"},
               {"role": "user", "content": "purple"}]
    r = client.chat.completions.create(model="colours", messages=history, temperature=0)
    reply = r.choices[0].message.content
    args = [tinygpt, "chat", "--ckpt", f"{tmp}/colours", "--chat-template", template, "--temperature", "0"]
    with open(f"{tmp}/h.json", "w") as f:
        json.dump(history, f)
    chat = subprocess.run(args + ["--messages", f"{tmp}/h.json"], capture_output=True, text=True)
    check(chat.stdout == reply + "\n", "a greedy chat reply equals `tinygpt chat`'s", f"{reply!r} vs {chat.stdout!r}")
    check(reply == "grape" and r.choices[0].finish_reason == "stop", "the trained model answers purple with grape",
          f"{reply!r}, {r.choices[0].finish_reason}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "usage adds up", str(r.usage))
    pieces = [c.choices[0].delta.content or "" for c in
              client.chat.completions.create(model="colours", messages=history, temperature=0, stream=True)
              if c.choices]
    check("".join(pieces) == reply, "the streamed pieces joined equal the reply", f"{pieces}")
    t = client.completions.create(model="colours", prompt="u:yellow|\na:", temperature=0, max_tokens=20, stop=["|"])
    check(t.choices[0].text == "banana" and t.choices[0].finish_reason == "stop", "a text completion with a stop string",
          f"{t.choices[0].text!r}, {t.choices[0].finish_reason}")
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="colours", prompt="u:yellow|\na:", temperature=0, max_tokens=20, stop=["|"], stream=True) if c.choices)
    check(streamed == t.choices[0].text, "a streamed text completion equals the whole", repr(streamed))
    for expected, call in (
            (openai.AuthenticationError, lambda: openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="sk-no",
                                                               max_retries=0).models.list()),
            (openai.NotFoundError, lambda: client.chat.completions.create(model="gpt-4o", messages=history)),
            (openai.BadRequestError, lambda: client.chat.completions.create(model="colours", messages=history,
                                                                            temperature=3))):
        try:
            call()
            check(False, f"{expected.__name__} raised", "no exception")
        except expected as e:
            check(isinstance(e.body, dict) and "message" in e.body, f"{expected.__name__} raised, with a message",
                  str(e.body))
finally:
    server.stop()
sys.exit(1 if failures else 0)
