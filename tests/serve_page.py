#!/usr/bin/env python3
"""The chat page at / in headless Chromium (selenium): a model trained here to answer colours with fruit is served;
the page names it, a typed message gets its streamed reply (greedy: the model's own answer), a second turn too, the
page fits a phone's width, and Reset clears the conversation. Run by tests/test_serve_page.sh.
  serve_page.py path/to/tinygpt [--screenshot FILE.png]"""
import os
import sys
import tempfile

from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import WebDriverWait

sys.dont_write_bytecode = True  # nothing written into the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_fixture  # noqa: E402

tinygpt = sys.argv[1]
screenshot = sys.argv[sys.argv.index("--screenshot") + 1] if "--screenshot" in sys.argv else None
failures = []


def check(ok, message):
    if not ok:
        print("FAIL:", message, flush=True)
        failures.append(message)
    return ok


tmp = tempfile.mkdtemp()
template = serve_fixture.colour_model(tinygpt, tmp, f"{tmp}/colours")
server = serve_fixture.Server(tinygpt, "--ckpt", f"{tmp}/colours", "--chat-template", template)
port = server.port

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
    server.stop()
if failures:
    sys.exit(f"serve_page: {len(failures)} failure(s)")
print("serve_page: the chat page answered red and green through Chromium (apple, lime), fits 390 pixels, resets")
