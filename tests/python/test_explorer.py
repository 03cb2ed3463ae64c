"""The explorer (`diffattn explore`) end to end: its JSON API's errors over HTTP, then the page in
headless Chromium: load it, drag the lambda slider, click a row, and check the table's numbers
against the library and the screenshot's pixels where the heatmaps and the bar chart must be.
The test starts the server on a free port and stops it."""

import io
import json
import os
import select
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request

import numpy as np
import pytest

import diffattn

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BINARY = os.path.join(ROOT, "build", "diffattn")

Q = np.array([[1, 0, 1, 0], [0, 2, 0, 1], [1, 1, 1, 0], [0, 0, 1, 1], [1, 0, 0, 1]], np.float32)
K = np.array([[0, 1, 0, 1], [1, 0, 1, 0], [1, 1, 0, 0], [0, 0, 1, 1], [1, 0, 0.5, 0.5]], np.float32)
V = np.array([[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1], [0.5] * 4], np.float32)


@pytest.fixture(scope="module")
def server():
    proc = subprocess.Popen([BINARY, "explore", "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    ready, _, _ = select.select([proc.stdout], [], [], 20)
    assert ready, "the server printed nothing within 20 s"
    line = proc.stdout.readline()
    assert "listening on http://127.0.0.1:" in line, line
    url = line.split("listening on ")[1].split()[0].rstrip("/")
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0, "the server must stop cleanly on SIGTERM"


def call(url, method="GET", body=None):
    data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def library_row(lam, mode, row):
    q = np.ascontiguousarray(Q.reshape(1, 5, 2, 2))
    k = np.ascontiguousarray(K.reshape(1, 5, 2, 2))
    v = np.ascontiguousarray(V.reshape(1, 5, 1, 4))
    a1, a2 = diffattn.diff_attention_maps(q, k, v, np.array([lam], np.float32))
    a1, a2 = a1[0, 0, row].astype(np.float64), a2[0, 0, row].astype(np.float64)
    d = a1 - np.float64(np.float32(lam)) * a2
    if mode == "clamp":
        d = np.maximum(d, 0)
        d = d / d.sum()
    std = diffattn.attention_map(Q.reshape(1, 5, 1, 4), K.reshape(1, 5, 1, 4),
                                 V.reshape(1, 5, 1, 4))[0, 0, row]
    return {"map1": a1, "map2": a2, "diff": d, "standard": std}


def test_api_rejects_bad_input_with_named_fields(server):
    cases = [
        ({"lambda": "x"}, 400, '"lambda"'),
        ({"lambda": 1e9}, 400, '"lambda"'),
        ({"mode": "both"}, 400, '"mode"'),
        ({"causal": 1}, 400, '"causal"'),
        ({"source": "model"}, 400, '"source"'),
        ({"source": "random", "length": 100000}, 400, '"length"'),
        ({"source": "random", "seed": -1}, 400, '"seed"'),
        ({"colour": "red"}, 400, '"colour"'),
        ({"prompt": "x" * 5000}, 400, '"prompt"'),
    ]
    for body, status, field in cases:
        got, reply = call(server + "/api/views", "POST", body)
        assert got == status and field in reply["error"], (body, got, reply)
    got, reply = call(server + "/api/views", "POST", b"{not json")
    assert got == 400 and "JSON" in reply["error"]
    got, reply = call(server + "/api/views", "POST", b"x" * 100000)
    assert got == 413 and "16384" in reply["error"]
    assert call(server + "/api/nothing")[0] == 404
    assert call(server + "/api/views")[0] == 405
    got, reply = call(server + "/api/views", "POST", {"source": "random", "length": 64, "seed": 3})
    assert got == 200 and len(reply["tokens"]) == 64 and len(reply["views"]["diff"][63]) == 64
    # The server is still alive and answers correctly after all of that.
    got, reply = call(server + "/api/views", "POST", {"lambda": 0.4, "mode": "clamp"})
    assert got == 200
    assert reply["views"]["diff"][1][3] == 0.0  # cat -> on is clamped to zero (the textbook)
    assert abs(reply["views"]["diff"][1][2] - 0.5052) < 5e-5


def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium = shutil.which("chromium")
    driver_path = shutil.which("chromedriver")
    assert chromium and driver_path, "Debian's chromium and chromium-driver are required " \
                                     "(scripts/setup.sh installs them)"
    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for flag in ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1500,1300",
                 "--force-device-scale-factor=1", "--disable-dev-shm-usage"]:
        opts.add_argument(flag)
    import tempfile
    profile = tempfile.mkdtemp(prefix="diffattn-chromium-")
    opts.add_argument("--user-data-dir=" + profile)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    return driver, profile


def wait_for(driver, cond, what, timeout=15):
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError("timed out waiting for " + what)


def test_page_in_headless_chromium(server, tmp_path):
    from PIL import Image
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    driver, profile = browser()
    try:
        driver.get(server + "/")
        body = driver.find_element(By.TAG_NAME, "body")
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1", "the first views")
        assert body.get_attribute("data-lambda").startswith("0.4")

        # Drag the slider's thumb to the right: lambda goes up from 0.4.
        slider = driver.find_element(By.ID, "lambda")
        ActionChains(driver).click_and_hold(slider).move_by_offset(60, 0).release().perform()
        shown = float(driver.find_element(By.ID, "lambda-value").text)
        assert 0.5 < shown <= 1.2, shown
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1" and
                 abs(float(body.get_attribute("data-lambda")) - shown) < 0.006,
                 "views at the dragged lambda")
        lam = float(body.get_attribute("data-lambda"))

        # Click row "cat" (query 1) on the differential heatmap.
        canvas = driver.find_element(By.ID, "view-diff")
        left = float(canvas.get_attribute("data-grid-left"))
        top = float(canvas.get_attribute("data-grid-top"))
        cell = float(canvas.get_attribute("data-cell"))
        w, h = canvas.size["width"], canvas.size["height"]

        def cell_offset(i, j):  # offsets from the canvas centre (W3C actions)
            return left + (j + 0.5) * cell - w / 2, top + (i + 0.5) * cell - h / 2

        ActionChains(driver).move_to_element_with_offset(canvas, *cell_offset(1, 2)).click().perform()
        wait_for(driver, lambda: body.get_attribute("data-row") == "1", "the clicked row")
        assert driver.find_element(By.ID, "selected-row").text == "cat"
        # Hovering shows the number.
        tip = driver.find_element(By.ID, "tooltip")
        assert "cat" in tip.text and "sat" in tip.text

        want = library_row(lam, "signed", 1)
        for view in ["map1", "map2", "diff", "standard"]:
            tds = driver.find_elements(By.CSS_SELECTOR, f'#row-table tr[data-view="{view}"] td[data-value]')
            got = np.array([float(td.get_attribute("data-value")) for td in tds])
            assert got.shape == (5,)
            np.testing.assert_allclose(got, want[view], atol=2e-6, err_msg=view)
        assert float(driver.find_elements(
            By.CSS_SELECTOR, '#row-table tr[data-view="diff"] td[data-value]')[3]
            .get_attribute("data-value")) < 0, "cat -> on is negative in signed mode at this lambda"

        # Screenshot: heatmap cells and bars are where they must be, in the right colours.
        png = driver.get_screenshot_as_png()
        (tmp_path / "explorer.png").write_bytes(png)
        img = Image.open(io.BytesIO(png)).convert("RGB")
        loc = canvas.location

        def pixel(i, j):
            return img.getpixel((int(loc["x"] + left + (j + 0.5) * cell),
                                 int(loc["y"] + top + (i + 0.5) * cell)))

        r, g, b = pixel(1, 2)  # cat -> sat: the largest positive weight, red
        assert r > 150 and r > b + 60, (r, g, b)
        r, g, b = pixel(1, 3)  # cat -> on: negative, on the blue side of white
        assert b > r, (r, g, b)
        bars = driver.find_element(By.ID, "bars")
        bl = bars.location
        crop = img.crop((bl["x"], bl["y"], bl["x"] + bars.size["width"], bl["y"] + bars.size["height"]))
        colours = set(crop.get_flattened_data() if hasattr(crop, "get_flattened_data") else crop.getdata())
        for c in [(31, 119, 180), (255, 127, 14), (214, 39, 40), (44, 160, 44)]:
            assert c in colours, f"bar colour {c} missing from the bar chart"
        m1 = driver.find_element(By.ID, "view-map1")
        m1l = m1.location
        c1 = img.getpixel((int(m1l["x"] + left + 2.5 * cell), int(m1l["y"] + top + 1.5 * cell)))
        assert c1[0] > 200 and c1[1] > 200 and c1[2] < 80, c1  # A1[cat, sat] is the row max: yellow

        # Clamp mode: the differential row is renormalised, non-negative and sums to 1.
        driver.find_element(By.CSS_SELECTOR, 'input[name=mode][value="clamp"]').click()
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1" and
                 body.get_attribute("data-mode") == "clamp", "clamp mode")
        tds = driver.find_elements(By.CSS_SELECTOR, '#row-table tr[data-view="diff"] td[data-value]')
        got = np.array([float(td.get_attribute("data-value")) for td in tds])
        np.testing.assert_allclose(got, library_row(lam, "clamp", 1)["diff"], atol=2e-6)
        assert got.min() >= 0 and abs(got.sum() - 1) < 1e-5

        # A random head of 40 tokens, causal: the upper triangle is empty in every view.
        driver.find_element(By.CSS_SELECTOR, 'option[value="random"]').click()
        driver.find_element(By.ID, "causal").click()
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1" and
                 body.get_attribute("data-source") == "random" and
                 body.get_attribute("data-causal") == "true", "the random causal head")
        assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


# ---- a trained model as a source (explore --model DIR) ----

@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Tiny DIFF V1 and standard models from `diffattn experiment retrieval` with a tiny budget
    (seconds): the experiment command end to end, and the models the explorer serves."""
    out = tmp_path_factory.mktemp("retrieval")
    proc = subprocess.run(
        [BINARY, "--threads", "1", "experiment", "retrieval", "--out", str(out), "--context", "32",
         "--min-context", "0", "--needles", "3", "--queries", "2", "--lengths", "32,40",
         "--depths", "0,1", "--steps", "4", "--batch", "2", "--eval-samples", "3",
         "--noise-samples", "2", "--d-model", "16", "--heads", "2", "--ffn", "32",
         "--kinds", "diff_v1,standard"],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    for want in ["Accuracy by context length", "Accuracy by needle depth", "Attention noise",
                 "A1 - lambda A2", "parameters"]:
        assert want in proc.stdout, want
    for f in ["report.md", "accuracy_by_length.png", "accuracy_by_depth.png", "training_loss.png",
              "query_row.png", "query_row_diff_v1.npy", "models/diff_v1/config.json",
              "models/standard/model.safetensors", "models/diff_v1/retrieval.json"]:
        assert (out / f).is_file(), f
    assert np.load(out / "query_row_diff_v1.npy").shape[0] == 2 * 1  # layers x pairs
    return out


def test_maps_and_analyze_commands(trained, tmp_path):
    model = str(trained / "models" / "diff_v1")
    prompt = "ab#KD7cd?KD"
    proc = subprocess.run([BINARY, "maps", "--model", model, "--prompt", prompt, "--layer", "1",
                           "--head", "0", "--out", str(tmp_path)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    m1, m2, d, s = (np.load(tmp_path / f"layer1_head0_{v}.npy") for v in ["map1", "map2", "diff", "standard"])
    assert m1.shape == (len(prompt), len(prompt))
    np.testing.assert_allclose(m1.sum(1), 1, atol=1e-5)
    np.testing.assert_allclose(s.sum(1), 1, atol=1e-5)
    assert np.all(np.triu(m1, 1) == 0), "causal: no weight above the diagonal"
    lam = float(proc.stdout.split("lambda ")[1].split()[0])
    np.testing.assert_allclose(d, m1 - lam * m2, atol=2e-3)  # lambda printed with 3 decimals
    proc = subprocess.run([BINARY, "maps", "--model", model, "--prompt", prompt, "--mean-layers",
                           "--mean-heads", "--lambda", "0.5", "--out", str(tmp_path)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    m1 = np.load(tmp_path / "mean_layers_mean_heads_map1.npy")
    m2 = np.load(tmp_path / "mean_layers_mean_heads_map2.npy")
    np.testing.assert_allclose(np.load(tmp_path / "mean_layers_mean_heads_diff.npy"), m1 - 0.5 * m2, atol=1e-6)
    bad = subprocess.run([BINARY, "maps", "--model", model, "--prompt", prompt, "--layer", "7"],
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "--layer" in bad.stderr
    proc = subprocess.run([BINARY, "analyze", "--model", model, "--samples", "3"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "3 held-out contexts of 32 tokens, 6 answer rows" in proc.stdout
    assert "A1 alone" in proc.stdout and "mean" in proc.stdout


@pytest.fixture(scope="module")
def model_server(trained):
    dirs = f"{trained}/models/diff_v1,{trained}/models/standard"
    proc = subprocess.Popen([BINARY, "explore", "--port", "0", "--model", dirs], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    # Read the raw pipe: select() on a buffered readline misses lines already in Python's buffer
    # (the model lines and the "listening" line often arrive in one chunk).
    url = None
    said = b""
    fd = proc.stdout.fileno()
    end = time.time() + 20
    while time.time() < end and url is None:
        ready, _, _ = select.select([fd], [], [], 1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:  # the server exited
                break
            said += chunk
            text = said.decode(errors="replace")
            rest = text.split("listening on ", 1)[1] if "listening on " in text else ""
            if "\n" in rest:  # the whole line is in
                url = rest.split()[0].rstrip("/")
    assert url, f"the server did not start (exit status {proc.poll()}): {said.decode(errors='replace')}"
    yield url
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0


def test_model_source_api(model_server):
    got, info = call(model_server + "/api/info")
    assert got == 200 and "model" in info["sources"] and len(info["models"]) == 2
    assert info["models"][0]["kind"] == "diff_v1" and "?" in info["models"][0]["example_prompt"]
    base = {"source": "model", "model": 0, "prompt": "ab#KD7cd?KD"}
    got, r = call(model_server + "/api/views", "POST", dict(base, layer=1, head=0))
    assert got == 200 and r["tokens"] == list("ab#KD7cd?KD") and r["lambda_learned"]
    m1, m2, d = (np.array(r["views"][v]) for v in ["map1", "map2", "diff"])
    np.testing.assert_allclose(d, m1 - np.float32(r["lambda"]) * m2, atol=1e-6)
    got, r = call(model_server + "/api/views", "POST", dict(base, model=1))
    assert got == 200 and r["views"]["map1"] is None and r["views"]["standard"] is not None
    for body, field in [(dict(base, layer=9), '"layer"'), (dict(base, head=5), '"head"'),
                        (dict(base, model=2), '"model"'), (dict(base, prompt="x" * 200), '"prompt"'),
                        (dict(base, prompt=""), '"prompt"'), ({"source": "model"}, '"prompt"'),
                        ({"layer": 0}, '"layer"'), (dict(base, seed=1), '"seed"')]:
        got, reply = call(model_server + "/api/views", "POST", body)
        assert got == 400 and field in reply["error"], (body, got, reply)


def test_model_source_in_headless_chromium(model_server, tmp_path):
    from PIL import Image
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    driver, profile = browser()
    try:
        driver.get(model_server + "/")
        body = driver.find_element(By.TAG_NAME, "body")
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1", "the first views")
        wait_for(driver, lambda: len(driver.find_elements(By.CSS_SELECTOR, 'option[value="model:0"]')) == 1,
                 "the models in the source list")
        Select(driver.find_element(By.ID, "source")).select_by_value("model:0")
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1" and
                 body.get_attribute("data-source") == "model", "the model's views")
        prompt = driver.find_element(By.ID, "prompt")
        prompt.clear()
        prompt.send_keys("ab#KD7cd?KD\n")
        Select(driver.find_element(By.ID, "layer")).select_by_value("1")
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1" and
                 body.get_attribute("data-layer") == "1" and
                 body.get_attribute("data-learned") == "true", "layer 1 with the learned lambda")
        _, want = call(model_server + "/api/views", "POST",
                       {"source": "model", "model": 0, "prompt": "ab#KD7cd?KD", "layer": 1, "head": 0})
        assert abs(float(body.get_attribute("data-lambda")) - want["lambda"]) < 1e-6

        # Click the last row (the query's key) on the differential map; the table is the API's row.
        canvas = driver.find_element(By.ID, "view-diff")
        left = float(canvas.get_attribute("data-grid-left"))
        top = float(canvas.get_attribute("data-grid-top"))
        cell = float(canvas.get_attribute("data-cell"))
        assert int(canvas.get_attribute("data-tokens")) == 11
        w, h = canvas.size["width"], canvas.size["height"]
        ActionChains(driver).move_to_element_with_offset(
            canvas, left + 3.5 * cell - w / 2, top + 10.5 * cell - h / 2).click().perform()
        wait_for(driver, lambda: body.get_attribute("data-row") == "10", "the clicked row")
        for view in ["map1", "map2", "diff", "standard"]:
            tds = driver.find_elements(By.CSS_SELECTOR, f'#row-table tr[data-view="{view}"] td[data-value]')
            got = np.array([float(td.get_attribute("data-value")) for td in tds])
            np.testing.assert_allclose(got, want["views"][view][10], atol=1e-6, err_msg=view)

        # Drag lambda: the differential row is recomputed with the slider's lambda.
        slider = driver.find_element(By.ID, "lambda")
        ActionChains(driver).click_and_hold(slider).move_by_offset(40, 0).release().perform()
        shown = float(driver.find_element(By.ID, "lambda-value").text)
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1" and
                 body.get_attribute("data-learned") == "false" and
                 abs(float(body.get_attribute("data-lambda")) - shown) < 0.006, "the dragged lambda")
        lam = float(body.get_attribute("data-lambda"))
        tds = driver.find_elements(By.CSS_SELECTOR, '#row-table tr[data-view="diff"] td[data-value]')
        got = np.array([float(td.get_attribute("data-value")) for td in tds])
        m1, m2 = np.array(want["views"]["map1"][10]), np.array(want["views"]["map2"][10])
        np.testing.assert_allclose(got, m1 - np.float32(lam) * m2, atol=2e-6)

        # Screenshot: the differential heatmap is drawn where the page says it is.
        png = driver.get_screenshot_as_png()
        (tmp_path / "explorer_model.png").write_bytes(png)
        img = Image.open(io.BytesIO(png)).convert("RGB")
        loc = canvas.location
        r, g, b = img.getpixel((int(loc["x"] + left + 10.5 * cell), int(loc["y"] + top + 0.5 * cell)))
        assert abs(r - 247) <= 8 and abs(g - 247) <= 8 and abs(b - 247) <= 8, (r, g, b)  # masked: white (0)

        # The standard model shows one map only.
        Select(driver.find_element(By.ID, "source")).select_by_value("model:1")
        wait_for(driver, lambda: body.get_attribute("data-ready") == "1" and
                 body.get_attribute("data-source") == "model" and
                 driver.find_element(By.ID, "fig-map1").get_attribute("hidden") is not None,
                 "the standard model's one map")
        assert driver.find_element(By.ID, "fig-standard").get_attribute("hidden") is None
        assert driver.find_element(By.ID, "error").get_attribute("hidden") is not None
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
