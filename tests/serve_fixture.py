"""What the server's tests share: a small character model trained to answer colours with fruit ("u:red|" gets
"a:apple|"), its one-line chat template, and a `tinygpt serve` on a free port with its stderr collected. Used by
tests/test_serve.py, tests/serve_page.py and tests/reference/check_serve_openai.py."""
import random
import re
import signal
import subprocess
import threading

PAIRS = [("red", "apple"), ("yellow", "banana"), ("green", "lime"), ("purple", "grape")]
TEMPLATE = ("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}|\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")


def colour_model(tinygpt, tmp, out, iters=300):
    """Writes tmp/conv.txt and tmp/short.jinja and trains the model into `out` (2 x 64, context 64) for `iters`
    iterations; returns the template's path. Exits, saying why, when training fails."""
    rng = random.Random(1)
    with open(f"{tmp}/conv.txt", "w") as f:
        for _ in range(4000):
            u, a = rng.choice(PAIRS)
            f.write(f"u:{u}|\na:{a}|\n")
    with open(f"{tmp}/short.jinja", "w") as f:
        f.write(TEMPLATE)
    t = subprocess.run([tinygpt, "train", "--data", f"{tmp}/conv.txt", "--out", out, "--n-layer", "2", "--n-head", "2",
                        "--n-embd", "64", "--block-size", "64", "--batch-size", "16", "--max-iters", str(iters),
                        "--lr-decay-iters", "300", "--warmup-iters", "20", "--lr", "3e-3", "--eval-interval",
                        str(iters), "--eval-iters", "2"], capture_output=True, text=True)
    if t.returncode != 0:
        raise SystemExit(f"FAIL: train exited {t.returncode}: {t.stderr[-500:]}")
    return f"{tmp}/short.jinja"


class Server:
    """A `tinygpt serve` on a free port (`port`), its stderr lines collected (`lines`)."""

    def __init__(self, tinygpt, *args):
        self.proc = subprocess.Popen([tinygpt, "serve", "--port", "0", *args], stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def read():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
                if m:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        self.reader = threading.Thread(target=read, daemon=True)
        self.reader.start()
        if not ready.wait(60) or self.port is None:
            raise SystemExit(f"FAIL: serve did not start: {self.log()}")

    def log(self):
        return "\n".join(self.lines[-20:])

    def stop(self, sig=signal.SIGTERM, timeout=30):
        """Signals the server and waits; its exit status, or "hung"."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = "hung"
        self.reader.join(5)
        return code
