#!/usr/bin/env python3
"""The chat page at / in headless Chromium (selenium): a model trained here to answer colours with fruit is served;
the page names it, a typed message gets its streamed reply (greedy: the model's own answer), a second turn too, the
page fits a phone's width, and Reset clears the conversation. Run by tests/test_serve_page.sh.
  serve_page.py path/to/tinygpt [--screenshot FILE.png]"""
import os
import random
import re
import subprocess
import sys
import tempfile
import threading

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

tinygpt = sys.argv[1]
screenshot = sys.argv[sys.argv.index("--screenshot") + 1] if "--screenshot" in sys.argv else None
failures = []


def check(ok, message):
    if not ok:
        print("FAIL:", message, flush=True)
        failures.append(message)
    return ok


tmp = tempfile.mkdtemp()
random.seed(1)
pairs = [("red", "apple"), ("yellow", "banana"), ("green", "lime"), ("purple", "grape")]
with open(f"{tmp}/conv.txt", "w") as f:
    for _ in range(4000):
        u, a = random.choice(pairs)
        f.write(f"u:{u}|\na:{a}|\n")
with open(f"{tmp}/short.jinja", "w") as f:
    f.write("{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}|\n{% endfor %}"
            "{% if add_generation_prompt %}a:{% endif %}")
train = subprocess.run([tinygpt, "train", "--data", f"{tmp}/conv.txt", "--out", f"{tmp}/colours", "--n-layer", "2",
                        "--n-head", "2", "--n-embd", "64", "--block-size", "64", "--batch-size", "16", "--max-iters",
                        "300", "--warmup-iters", "20", "--lr", "3e-3", "--eval-interval", "300", "--eval-iters", "2"],
                       capture_output=True, text=True)
if train.returncode != 0:
    sys.exit(f"FAIL: train exited {train.returncode}: {train.stderr[-300:]}")
server = subprocess.Popen([tinygpt, "serve", "--ckpt", f"{tmp}/colours", "--chat-template", f"{tmp}/short.jinja",
                           "--port", "0"], stderr=subprocess.PIPE, text=True)
port = None
for line in server.stderr:
    m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
    if m:
        port = int(m.group(1))
        break
if port is None:
    sys.exit("FAIL: serve did not start")
threading.Thread(target=lambda: [None for _ in server.stderr], daemon=True).start()

options = Options()
options.binary_location = "/usr/bin/chromium"
for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=390,760"):
    options.add_argument(flag)
driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
try:
    driver.get(f"http://127.0.0.1:{port}/")
    wait = WebDriverWait(driver, 30)
    wait.until(lambda d: d.find_element(By.ID, "title").text == "tinygpt: colours")
    # Greedy, so the reply is the model's own answer.
    driver.execute_script("const t = document.getElementById('temperature'); t.value = 0;"
                          "t.dispatchEvent(new Event('input'));")

    def turn(text):
        box = driver.find_element(By.ID, "input")
        box.send_keys(text)
        box.send_keys(Keys.ENTER)
        wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, ".msg.assistant")) >= turn.count + 1
                   and d.find_element(By.ID, "send").is_enabled())
        turn.count += 1
        return driver.find_elements(By.CSS_SELECTOR, ".msg.assistant")[-1].text
    turn.count = 0

    first = turn("red")
    check(first == "apple", f"the page's reply to red is '{first}', not 'apple'")
    second = turn("green")
    check(second == "lime", f"the page's reply to green is '{second}', not 'lime'")
    users = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".msg.user")]
    check(users == ["red", "green"], f"the page shows the user's turns as {users}")
    errors = [e.text for e in driver.find_elements(By.CSS_SELECTOR, ".msg.error")]
    check(not errors, f"the page shows errors: {errors}")
    wide = driver.execute_script("return document.documentElement.scrollWidth > window.innerWidth")
    check(not wide, "the page is wider than a phone's 390 pixels")
    if screenshot:
        driver.save_screenshot(screenshot)
        print(f"serve_page: screenshot in {screenshot}")
    driver.find_element(By.ID, "reset").click()
    check(not driver.find_elements(By.CSS_SELECTOR, ".msg.assistant"), "Reset left the replies on the page")
finally:
    driver.quit()
    server.terminate()
    server.wait(30)
if failures:
    sys.exit(f"serve_page: {len(failures)} failure(s)")
print("serve_page: the chat page answered red and green through Chromium (apple, lime), fits 390 pixels, resets")
