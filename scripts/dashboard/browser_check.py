#!/usr/bin/env python3
"""Checks the built-in dashboard (/-/dashboard) in a real browser, end to end.

Needs a running `modelmux serve` with an admin token whose deployment DEPLOYMENT serves
multiplexed models, Debian's `chromium` and `chromium-driver`, and Selenium 4:

    apt-get install -y chromium chromium-driver && .venv/bin/pip install selenium
    MODELMUX_ADMIN_TOKEN=t target/debug/modelmux serve &
    .venv/bin/python scripts/dashboard/browser_check.py --url http://127.0.0.1:8000 \
        --token t --deployment Classifier --model customer-1 --screenshot /tmp/dashboard.png

Steps (each fails with a message and exit status 1):
  a. open the page headless without a token: it must ask for the token (the state answered
     401); enter the token into #admin-token; the deployment must appear;
  b. send one request for MODEL (header serve_multiplexed_model_id), note the replica that
     answered (x-modelmux-replica, else /-/models), and wait for
     [data-replica=R] [data-model=MODEL]: the first state poll that began after the response
     must show it (it is on the page before the next poll begins);
  c. click its pin button: /-/models must show it pinned once the page's pin request has been
     answered, and the row data-pinned="true" by the first state poll that began after that;
  d. clear the token (input and sessionStorage), click unpin: the server must refuse (401),
     #action-status must show the refusal, and /-/models must still show the model pinned;
  e. the browser console must hold no SEVERE (or WARNING) entries but the 401s the
     steps cause on purpose (see `expected_console_error`);
  f. enter the token again, save a screenshot of the whole page to PATH (also on failure),
     and unpin the model with the API (unless --keep-pinned), leaving the server as it was;
  g. open another tab in front for HIDDEN_S: the hidden dashboard must send no state request
     meanwhile, and must poll again once shown.
Each step's order of events is checked in the page's own clock (Resource Timing, a
MutationObserver), not against a wall-clock limit: WAIT_S only bounds how long a broken page
is waited for.
Before step b, a model already loaded is evicted (with the API) so that step b measures a
fresh load and the check can run again on the same server.
"""

import argparse
import base64
import json
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By

WAIT_S = 30.0
HIDDEN_S = 3.0


class CheckFailed(Exception):
    pass


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--url", required=True, help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--token", required=True, help="the server's admin token")
    p.add_argument("--deployment", required=True, help="a deployment serving multiplexed models")
    p.add_argument("--model", required=True, help="a model id that deployment can load")
    p.add_argument("--screenshot", required=True, help="where to save a PNG of the page")
    p.add_argument("--request-path", default="/", help="the application path to send the request to")
    p.add_argument("--request-body", default='{"inputs": [[0.5, -1.2, 3.3, 0.1]]}',
                   help="the JSON body of that request")
    p.add_argument("--keep-pinned", action="store_true",
                   help="leave the model pinned at the end (default: unpin it with the API)")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    return p.parse_args()


# ---- the server's API, with urllib ---------------------------------------------------------

def http(method, url, headers=None, body=None, timeout=30):
    """(status, headers, parsed JSON or text) of one call; never raises for an HTTP status."""
    data = body.encode() if isinstance(body, str) else body
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, hdrs, raw = r.status, r.headers, r.read()
    except urllib.error.HTTPError as e:
        status, hdrs, raw = e.code, e.headers, e.read()
    except (urllib.error.URLError, OSError) as e:
        raise CheckFailed(f"cannot reach {url}: {e}") from e
    text = raw.decode(errors="replace")
    try:
        return status, hdrs, json.loads(text)
    except ValueError:
        return status, hdrs, text


class Api:
    def __init__(self, base, token, deployment):
        self.base, self.token, self.deployment = base, token, deployment

    def call(self, method, path, token=True):
        headers = {"Content-Type": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {self.token}"
        body = None if method == "GET" else "{}"
        return http(method, self.base + path, headers, body)

    def model_path(self, model):
        return f"/-/models/{urllib.parse.quote(self.deployment, safe='')}/{urllib.parse.quote(model, safe='')}"

    def holdings(self, model):
        """[(replica id, loaded entry)] of `model` in the deployment, from GET /-/models."""
        status, _, body = self.call("GET", "/-/models")
        if status != 200:
            raise CheckFailed(f"GET /-/models with the token answered {status}: {body}")
        found, deployments = [], []
        for app in body.get("applications", []):
            for dep in app.get("deployments", []):
                deployments.append(dep["name"])
                if dep["name"] != self.deployment:
                    continue
                for rep in dep.get("replicas", []):
                    for m in rep.get("loaded", []):
                        if m.get("id") == model:
                            found.append((rep["id"], m))
        if self.deployment not in deployments:
            raise CheckFailed(f"/-/models has no deployment '{self.deployment}' (it has {deployments})")
        return found


# ---- the browser ---------------------------------------------------------------------------

def css_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\a ") + '"'


def wait_for(what, predicate, limit, step=0.02):
    """Calls `predicate` until it returns something truthy; that, and the seconds it took."""
    start = time.monotonic()
    while True:
        try:
            value = predicate()
        except StaleElementReferenceException:
            value = None
        elapsed = time.monotonic() - start
        if value:
            return value, elapsed
        if elapsed > limit:
            raise CheckFailed(f"{what}: not within {limit:g} s")
        time.sleep(step)


def watch_for(driver, selector):
    """From now on, records the page time (performance.now()) at which `selector` first matches."""
    driver.execute_script("""
        const sel = arguments[0];
        window.__seen = window.__seen || {};
        const check = () => {
            if (!(sel in window.__seen) && document.querySelector(sel)) window.__seen[sel] = performance.now();
        };
        new MutationObserver(check).observe(document, {subtree: true, childList: true, attributes: true});
        check();""", selector)


def seen_at(driver, selector):
    return driver.execute_script("return (window.__seen || {})[arguments[0]];", selector)


def page_now(driver):
    return driver.execute_script("return performance.now();")


def fetches(driver, path_part):
    """The page's requests whose URL holds `path_part`: [start, end] in page time, oldest first."""
    return driver.execute_script("""
        return performance.getEntriesByType("resource").filter((e) => e.name.includes(arguments[0]))
            .map((e) => [e.startTime, e.responseEnd]);""", path_part)


def shown_by_first_poll_after(driver, what, selector, since):
    """`selector` was on the page before the second state poll that began after `since` began:
    the first poll after `since` showed it. Returns when it appeared, in ms after `since`."""
    at = seen_at(driver, selector)
    polls = [start for start, _ in fetches(driver, "/-/dashboard/state") if start >= since]
    if at is None:
        raise CheckFailed(f"{what}: {selector} never recorded on the page")
    if len(polls) >= 2 and at > polls[1]:
        raise CheckFailed(f"{what}: {selector} appeared {at - since:.0f} ms after, only with the second "
                          f"state poll or later (polls began at {[round(p - since) for p in polls]} ms)")
    return at - since


def pinned_on_server(api, model):
    """The replicas where /-/models shows `model` pinned."""
    return [r for r, m in api.holdings(model) if m.get("pinned") is True]


def first(driver, selector):
    found = driver.find_elements(By.CSS_SELECTOR, selector)
    return found[0] if found else None


def start_browser(args):
    options = webdriver.ChromeOptions()
    options.binary_location = args.chromium
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    try:
        return webdriver.Chrome(options=options, service=Service(args.chromedriver))
    except WebDriverException as e:
        raise CheckFailed(f"cannot start {args.chromium} with {args.chromedriver}: {e.msg}") from e


def set_token(driver, value):
    box = driver.find_element(By.CSS_SELECTOR, "#admin-token")
    box.clear()
    if value:
        box.send_keys(value)
    else:
        driver.execute_script("sessionStorage.clear();")
    # `clear()` alone may fire no event: tell the page the way typing does.
    driver.execute_script("arguments[0].dispatchEvent(new Event('input', {bubbles: true}));", box)


def screenshot(driver, path):
    """The whole page, not only the window (Chrome's DevTools protocol)."""
    size = driver.execute_cdp_cmd("Page.getLayoutMetrics", {})["cssContentSize"]
    shot = driver.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}})
    try:
        with open(path, "wb") as f:
            f.write(base64.b64decode(shot["data"]))
    except OSError as e:
        raise CheckFailed(f"could not save the screenshot to {path}: {e}") from e


def expected_console_error(entry, state_401_before, action_path, tokenless):
    """The SEVERE entries the steps cause on purpose (Chrome logs every 4xx response of a
    fetch as "Failed to load resource: ... 401"):
    - step a opens the page before the token is entered, so its first GET /-/dashboard/state
      is refused (that is the 401 the page must turn into its "enter the token" message);
      only that one, logged before the token was entered (the page then waits for a token
      instead of asking again);
    - step d clears the token on purpose: a poll of /-/dashboard/state that falls between
      the clearing and step f's entering it again is refused too (`tokenless`, the window
      in milliseconds; whether a poll falls in it is timing, so it may or may not happen);
    - step d's unpin without the token, refused on purpose: exactly that one call.
    Everything else SEVERE is an error of the page."""
    msg = entry.get("message", "")
    if "status of 401" not in msg:
        return None
    at = entry.get("timestamp", 0)
    if "/-/dashboard/state" in msg and at <= state_401_before:
        return "state"
    if "/-/dashboard/state" in msg and tokenless[0] <= at <= tokenless[1]:
        return "state while the token was cleared"
    if action_path in msg:
        return "action"
    return None


# ---- the steps -----------------------------------------------------------------------------

def run(args, driver, api, report):
    base = args.url.rstrip("/")
    dep, model = args.deployment, args.model
    card = f"[data-deployment-card={css_string(dep)}]"

    # Start from a clean slate: not loaded (so that step b sees a fresh load), not pinned.
    if api.holdings(model):
        if any(m.get("pinned") for _, m in api.holdings(model)):
            api.call("POST", api.model_path(model) + "/unpin")
        status, _, body = api.call("DELETE", api.model_path(model))
        if status != 200:
            raise CheckFailed(f"setup: could not evict '{model}' first ({status}: {body})")
        print(f"setup: '{model}' was loaded already; evicted it first")

    # a. Open the page without a token: it must say it needs one; then enter it.
    driver.get(base + "/-/dashboard")
    if not first(driver, "#admin-token"):
        raise CheckFailed(f"a: {base}/-/dashboard has no #admin-token input")
    wait_for("a: the page asking for the admin token (#poll-status data-state=auth) after the state's 401",
             lambda: first(driver, '#poll-status[data-state="auth"]'), WAIT_S)
    asked = driver.find_element(By.CSS_SELECTOR, "#poll-status").text
    report["state_401_before"] = time.time() * 1000
    set_token(driver, args.token)
    if driver.execute_script("return sessionStorage.length;") < 1:
        raise CheckFailed("a: the token was not kept in sessionStorage")
    parts = urllib.parse.urlsplit(driver.current_url)
    if parts.query or parts.fragment:
        raise CheckFailed(f"a: the page's URL changed to {driver.current_url} (the token must never be in it)")
    wait_for("a: the state polled with the token (#poll-status data-state=ok)",
             lambda: first(driver, '#poll-status[data-state="ok"]'), WAIT_S)
    wait_for(f"a: the deployment '{dep}' on the page ({card})", lambda: first(driver, card), WAIT_S)
    print(f"a. page asked for the token ({asked!r}); with it, shows deployment '{dep}'")

    # b. One request for the model; its row must appear on the replica that answered, shown
    # by the first state poll that began after the response.
    any_row = f"[data-deployment={css_string(dep)}] [data-model={css_string(model)}]"
    watch_for(driver, any_row)
    start = time.monotonic()
    status, headers, body = http("POST", base + args.request_path, {
        "Content-Type": "application/json", "serve_multiplexed_model_id": model}, args.request_body, 120)
    answered_page = page_now(driver)
    answered = time.monotonic()
    if status != 200:
        raise CheckFailed(f"b: the request for '{model}' to {args.request_path} answered {status}: {body}")
    replica = headers.get("x-modelmux-replica")
    source = "x-modelmux-replica"
    if not replica:
        held = api.holdings(model)
        if not held:
            raise CheckFailed(f"b: after the request, /-/models shows '{model}' on no replica of '{dep}'")
        replica, source = held[0][0], "/-/models"
    row_sel = f"[data-replica={css_string(replica)}][data-deployment={css_string(dep)}] [data-model={css_string(model)}]"
    row = wait_for(f"b: {row_sel} after the request", lambda: first(driver, row_sel), WAIT_S)[0]
    appeared = shown_by_first_poll_after(driver, "b", any_row, answered_page) / 1000
    state = row.get_attribute("data-state")
    report["appeared"] = appeared
    print(f"b. request answered in {answered - start:.2f} s by replica {replica} ({source}); "
          f"its row appeared {appeared:.2f} s after the response, with the first poll after it, data-state={state}")

    # c. Pin it from the page: pinned on the server once the page's request is answered, and
    # on the page by the first state poll after that.
    pin = wait_for("c: the row's pin button", lambda: first(driver, row_sel + ' [data-action="pin"]'), WAIT_S)[0]
    pinned_sel = f"[data-deployment={css_string(dep)}] [data-model={css_string(model)}][data-pinned=\"true\"]"
    watch_for(driver, pinned_sel)
    pin_path = api.model_path(model) + "/load?pin=true"
    clicked = time.monotonic()
    pin.click()
    done = wait_for(f"c: the page's {pin_path} answered",
                    lambda: [end for _, end in fetches(driver, pin_path) if end > 0], WAIT_S)[0]
    on = pinned_on_server(api, model)
    if not on:
        raise CheckFailed(f"c: the page's pin request was answered, and /-/models does not show '{model}' pinned")
    t_server = time.monotonic() - clicked
    wait_for(f"c: {pinned_sel}", lambda: first(driver, pinned_sel), WAIT_S)
    t_page = shown_by_first_poll_after(driver, "c", pinned_sel, done[-1]) / 1000
    status_text = driver.find_element(By.CSS_SELECTOR, "#action-status").text
    report["pinned"], report["pinned_page"] = t_server, t_page
    print(f"c. pinned on {', '.join(on)}: /-/models said so {t_server:.2f} s after the click, "
          f"the row had data-pinned=\"true\" {t_page:.2f} s after the pin's answer, with the first poll after it; "
          f"#action-status: {status_text!r}")

    # d. Without the token, unpin must be refused, and the page must say so.
    report["token_cleared"] = time.time() * 1000
    set_token(driver, "")
    left = driver.execute_script("return [document.querySelector('#admin-token').value, sessionStorage.length];")
    if left != ["", 0]:
        raise CheckFailed(f"d: the token is still there after clearing it (input, sessionStorage) = {left}")
    unpin_sel = f"[data-deployment={css_string(dep)}] [data-model={css_string(model)}] [data-action=\"unpin\"]"
    unpin = wait_for("d: the row's unpin button", lambda: first(driver, unpin_sel), WAIT_S)[0]
    unpin.click()
    refusal = wait_for("d: #action-status showing the refusal (data-result=error)",
                       lambda: first(driver, '#action-status[data-result="error"]'), WAIT_S)[0].text
    if "401" not in refusal:
        raise CheckFailed(f"d: #action-status does not show the 401: {refusal!r}")
    still = pinned_on_server(api, model)
    if not still:
        raise CheckFailed(f"d: after the refused unpin, /-/models no longer shows '{model}' pinned")
    report["action_path"] = api.model_path(model) + "/unpin"
    print(f"d. unpin without the token refused; #action-status: {refusal!r}; still pinned on {', '.join(still)}")

    # f. The screenshot, with the token entered again (the live page, the refusal still shown).
    set_token(driver, args.token)
    wait_for("f: the state polled again with the token", lambda: first(driver, '#poll-status[data-state="ok"]'), WAIT_S)
    report["token_restored"] = time.time() * 1000
    screenshot(driver, args.screenshot)
    report["screenshot"] = args.screenshot
    print(f"f. screenshot saved to {args.screenshot}")

    # g. A hidden tab asks for nothing, and polls again as soon as it is shown.
    hidden_for = hidden_tab_polls_nothing(driver)
    print(f"g. hidden for {hidden_for:.1f} s with no state request; polling resumed when shown")

    # e. The console: nothing but the two 401s caused on purpose.
    entries = driver.get_log("browser")
    bad, filtered = [], []
    for entry in entries:
        if entry.get("level") not in ("SEVERE", "WARNING"):
            continue
        kind = expected_console_error(entry, report["state_401_before"], report["action_path"],
                                      (report["token_cleared"], report["token_restored"]))
        if entry.get("level") == "SEVERE" and kind and kind not in filtered:
            filtered.append(kind)
        else:
            bad.append(f"{entry.get('level')}: {entry.get('message')}")
    if bad:
        raise CheckFailed("e: the browser console has errors or warnings:\n  " + "\n  ".join(bad))
    report["console"] = (len(entries), filtered)
    print(f"e. console: {len(entries)} entries, no errors or warnings but the expected 401s ({', '.join(filtered) or 'none'})")


def hidden_tab_polls_nothing(driver):
    """Hides the dashboard's tab behind another for HIDDEN_S; returns how long it was hidden."""
    page = driver.current_window_handle
    driver.execute_script("""
        performance.clearResourceTimings();
        window.__visibility = [];
        document.addEventListener("visibilitychange",
            () => window.__visibility.push([document.visibilityState, performance.now()]));""")
    driver.switch_to.new_window("tab")
    time.sleep(HIDDEN_S)
    driver.close()
    driver.switch_to.window(page)

    def visibility_and_polls():
        return driver.execute_script("""
            return [window.__visibility, performance.getEntriesByType("resource")
                .filter((e) => e.name.includes("/-/dashboard/state")).map((e) => e.startTime)];""")

    def polled_once_shown():
        changes, polls = visibility_and_polls()
        shown = [t for state, t in changes if state == "visible"]
        return shown and any(t >= shown[-1] for t in polls)
    # A hidden page's poll schedules no next one: a request after being shown is the
    # visibility handler starting the polling again.
    wait_for("g: a state request once the tab was shown again", polled_once_shown, WAIT_S)
    changes, polls = visibility_and_polls()
    hid = [t for state, t in changes if state == "hidden"]
    shown = [t for state, t in changes if state == "visible"]
    if not hid or not shown or shown[-1] <= hid[0]:
        raise CheckFailed(f"g: the page did not go hidden and visible again behind another tab: {changes}")
    hidden_ms = shown[-1] - hid[0]
    if hidden_ms < HIDDEN_S * 1000 * 0.8:
        raise CheckFailed(f"g: the page was hidden only {hidden_ms:.0f} ms of {HIDDEN_S} s: {changes}")
    during = [t for t in polls if hid[0] < t < shown[-1]]
    if during:
        raise CheckFailed(f"g: the hidden page asked for the state {len(during)} times in {hidden_ms:.0f} ms "
                          f"(at {', '.join(f'{t - hid[0]:.0f}' for t in during)} ms after hiding)")
    return hidden_ms / 1000


def main():
    args = parse_args()
    api = Api(args.url.rstrip("/"), args.token, args.deployment)
    report, driver, failed = {}, None, None
    try:
        status = http("GET", args.url.rstrip("/") + "/-/dashboard/state")[0]
        if status != 401:
            raise CheckFailed(f"the server must have an admin token: /-/dashboard/state without it answered {status}")
        driver = start_browser(args)
        run(args, driver, api, report)
    except CheckFailed as e:
        failed = str(e)
    finally:
        if driver is not None:
            if failed and "screenshot" not in report:
                try:
                    screenshot(driver, args.screenshot)
                    print(f"(screenshot of the failure saved to {args.screenshot})", file=sys.stderr)
                except (CheckFailed, WebDriverException):
                    pass
            driver.quit()
        if not args.keep_pinned and "pinned" in report:
            status = api.call("POST", api.model_path(args.model) + "/unpin")[0]
            print(f"cleanup: unpinned '{args.model}' with the API ({status})")
    if failed:
        print(f"FAIL {failed}", file=sys.stderr)
        return 1
    n, filtered = report["console"]
    print(f"OK dashboard: '{args.model}' appeared on the page {report['appeared']:.2f} s after its response, "
          f"pinned in {report['pinned']:.2f} s (page {report['pinned_page']:.2f} s), unpin without token refused "
          f"and shown, console clean ({n} entries, {len(filtered)} expected 401s), screenshot {args.screenshot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
