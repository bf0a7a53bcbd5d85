"""The explanation page (inference/report.py) in a real headless browser: Debian's chromium driven by Playwright, as
predict.py --explain --html writes it and as serve.py's GET / serves it (its POST /predict answered by
inference.answers.answer_batch through a route, so no server process is needed).

The model has a planted over-uniform head (layer 0 head 0: its W_Q ×0.1, a scale 10× too small: weights 0.10-0.16
over 8 tokens) next to a sharp one (layer 0 head 1: W_Q ×8); the page must SHOW it: on the shared colour scale the
uniform map's pixel spread is far below the sharp one's (1.7 against 46 grey levels), though on its own contrast,
as each map was drawn before, it looks busy (14). Its checkpoint carries a hand-made monitor history of the shape
monitor/callback.py stores (Finding.to_dict per finding), drawn as verdict badges.

Skips, saying why, where chromium or the playwright package is missing: `make browser` installs both (root, apt).
Set REPORT_SCREENSHOT=path.png to keep the report's screenshot for a look.
"""

import io
import json
import math
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from inference.answers import answer_batch, model_info
from inference.limits import ServerLimits
from inference.report import live_page, write_report
from inference.request import parse_request
from inference.verdicts import stored_verdicts
from monitor.doctor import VERDICTS
from conftest import save_checkpoint, tiny_classifier

CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or shutil.which("chromium-browser") or "")
TEXTS = ["w1 alpha w2 beta w3 w4 w7 w9", "好 差 w5 差 好"]
ORIGIN = "http://serve.test"  # the served page's origin, answered by routes
HISTORY = [{"step": 10, "epoch": 0, "findings": []}, {"step": 20, "epoch": 1, "findings": [
    {"verdict": "averaging-head", "layer": 0, "head": 0,
     "figures": {"entropy": 1.0, "head_loss_delta": math.nan}},
    {"verdict": "padding-leak", "layer": 1, "head": None,
     "figures": {"pad_weight": 0.031, "padded_rows": 12.0}},
    {"verdict": "still-learning", "layer": None, "head": None, "figures": {"loss_drop": 0.2}},
]}]


def planted_classifier():
    """tiny_classifier with layer 0's head 0 over-uniform and its head 1 sharp."""
    classifier = tiny_classifier()
    layer = classifier.model.blocks[0].attention
    d = layer.d_head
    with torch.no_grad():
        layer.w_q.weight[:d] *= 0.1  # head 0: scores 10× too small, rows nearly uniform
        layer.w_q.weight[d : 2 * d] *= 8.0  # head 1: scores 8× wider, sharp rows
    return classifier


@pytest.fixture(scope="module")
def browser():
    if not CHROMIUM:
        pytest.skip("no chromium installed: `make browser` installs Debian's chromium (root, apt)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed: pip install -e '.[dev]'")
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    classifier = planted_classifier()
    path = save_checkpoint(classifier, tmp_path_factory.mktemp("planted") / "planted.ckpt")
    stored = torch.load(path, weights_only=True)
    stored["callbacks"] = {"AttentionMonitor{'num_probes': 1}": {"history": HISTORY}}
    torch.save(stored, path)
    return classifier, path


def open_tab(browser, url, route=None):
    tab = browser.new_page(viewport={"width": 1200, "height": 900})
    errors, requests = [], []
    tab.on("console", lambda message: message.type == "error" and errors.append(message.text))
    tab.on("pageerror", lambda error: errors.append(str(error)))
    tab.on("request", lambda r: r.url.startswith(("file:", ORIGIN)) or requests.append(r.url))
    if route:
        tab.route(f"{ORIGIN}/**", route)
    tab.goto(url)
    return tab, errors, requests


@pytest.fixture(scope="module")
def report(browser, checkpoint, tmp_path_factory):
    classifier, path = checkpoint
    explanations = classifier.explain(TEXTS, ig_steps=8)
    html = tmp_path_factory.mktemp("report") / "report.html"
    write_report(explanations, html, stored_verdicts(path))
    tab, errors, requests = open_tab(browser, html.as_uri())
    tab.wait_for_selector("canvas.heat")
    yield tab, errors, requests, explanations
    tab.close()


@pytest.fixture(scope="module")
def served(browser, checkpoint):
    """serve.py's page for the planted checkpoint, one text submitted."""
    classifier, path = checkpoint
    page = live_page(model_info([path]))

    def answer(route):
        if route.request.method == "POST":
            request = parse_request(route.request.post_data_buffer, ServerLimits(), ensemble=False)
            (body,) = answer_batch(classifier, [request], ig_steps=8)
            return route.fulfill(status=200, content_type="application/json", body=json.dumps(body))
        return route.fulfill(status=200, content_type="text/html", body=page)

    tab, errors, requests = open_tab(browser, f"{ORIGIN}/", answer)
    tab.fill("#input", TEXTS[0])
    tab.click("#submit")
    tab.wait_for_selector("#text0 canvas.heat", timeout=60_000)
    yield tab, errors, requests
    tab.close()


def colours(tab):
    return tab.eval_on_selector_all("#text0 .tok", "els => els.map(e => getComputedStyle(e).backgroundColor)")


def heat(tab, layer, head, text=0):
    return tab.locator(f"#text{text} canvas.heat[data-layer='{layer}'][data-head='{head}']")


def pixel_spread(tab, layer, head) -> float:
    """The std of the map element's pixels (grey levels), from a screenshot of it, its 1-px border cut off."""
    from PIL import Image

    image = np.asarray(Image.open(io.BytesIO(heat(tab, layer, head).screenshot())).convert("L"), dtype=float)
    return float(image[2:-2, 2:-2].std())


@pytest.mark.slow
@pytest.mark.parametrize("surface", ["report", "served"])
def test_a_planted_uniform_head_looks_uniform_on_the_shared_scale(surface, request):
    tab, errors = request.getfixturevalue(surface)[:2]
    uniform, sharp = pixel_spread(tab, 0, 0), pixel_spread(tab, 0, 1)
    assert sharp > 30 and uniform < sharp / 5, (uniform, sharp)
    switch = tab.locator("#text0 .map:has(canvas.heat[data-layer='0'][data-head='0']) input.stretch")
    switch.check()  # on its own contrast its small differences show: the shared scale is what flattens it
    assert pixel_spread(tab, 0, 0) > 3 * uniform
    switch.uncheck()
    assert errors == []


@pytest.mark.parametrize("surface", ["report", "served"])
def test_every_head_gets_its_verdict_badge_with_its_figures_on_hover(surface, request):
    tab, errors, requests = request.getfixturevalue(surface)[:3]
    badges = {(l, h): tab.locator(f"#text0 .map:has(canvas.heat[data-layer='{l}'][data-head='{h}']) .badge")
              for l in (0, 1) for h in (0, 1)}
    assert badges[0, 0].text_content() == "averaging-head" and "note" in badges[0, 0].get_attribute("class")
    assert badges[0, 1].text_content() == "ok"
    for h in (0, 1):  # a whole-layer warning is every head's
        assert badges[1, h].text_content() == "padding-leak" and "warning" in badges[1, h].get_attribute("class")
        assert "pad_weight 0.031" in badges[1, h].get_attribute("title")
        assert VERDICTS["padding-leak"].fix in badges[1, h].get_attribute("title")
    assert "head_loss_delta n/a" in badges[0, 0].get_attribute("title")  # NaN is stored, JSON has none
    assert "epoch 1" in tab.locator("#text0 .verdicts").text_content()
    assert tab.locator("#text0 .verdicts .badge").text_content() == "still-learning"
    assert errors == [] and requests == []


def test_a_checkpoint_without_monitor_history_says_not_examined(browser, tmp_path):
    path = tmp_path / "plain.html"
    write_report(tiny_classifier().explain(TEXTS[:1], ig_steps=4), path)
    tab, errors, _ = open_tab(browser, path.as_uri())
    assert set(tab.eval_on_selector_all(".map .badge", "bs => bs.map(b => b.textContent)")) == {"not examined"}
    assert errors == []
    tab.close()


def test_the_default_shading_is_the_method_whose_top_tokens_matter_most(report):
    tab, errors, _, explanations = report
    drops = {}
    for method in explanations[0].scores:
        curves = [e.faithfulness["deletion"][method] for e in explanations if e.scores[method] is not None]
        drops[method] = np.mean([np.mean(curve) for curve in curves])
    assert tab.locator("#switch button.active").get_attribute("data-method") == max(drops, key=drops.get)
    assert "drop k=N" in tab.locator("#text0 ul.columns").text_content()
    assert errors == []


def test_the_legend_follows_the_method_sign(report):
    tab, errors, _, _ = report
    tab.click("#switch button[data-method='occlusion']")
    assert "purple" in tab.locator("#legend").text_content()
    tab.click("#switch button[data-method='attention']")
    assert "never negative" in tab.locator("#legend").text_content()
    attention_colours = colours(tab)
    tab.click("#switch button[data-method='occlusion']")
    assert attention_colours != colours(tab)
    assert "replaced by [UNK]" in tab.locator("#text0 .method-note").text_content() and errors == []


def test_the_contrast_switch_rescales_one_map_and_says_so(report):
    tab, errors, _, _ = report
    pixels = "c => Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data).join()"
    others = [heat(tab, 1, h).evaluate(pixels) for h in (0, 1)]
    tab.locator("#text0 .map:has(canvas.heat[data-layer='1'][data-head='0']) input.stretch").check()
    assert heat(tab, 1, 0).evaluate(pixels) != others[0] and heat(tab, 1, 1).evaluate(pixels) == others[1]
    assert "not comparable" in tab.locator("#text0 .map:has(canvas.heat[data-layer='1'][data-head='0'])").text_content()
    tab.locator("#text0 .map:has(canvas.heat[data-layer='1'][data-head='0']) input.stretch").uncheck()
    assert heat(tab, 1, 0).evaluate(pixels) == others[0] and errors == []


def test_hovering_marks_the_row_and_names_the_tokens_on_the_axes(report):
    tab, errors, _, _ = report
    axis = "c => Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data).join()"
    rows = tab.locator("#text0 canvas.rows").first
    before, blank = rows.evaluate(axis), rows.evaluate("c => new Array(c.width * c.height * 4).fill(0).join()")
    assert before != blank  # the tokens are written on the axis
    tab.hover("#text0 .tok >> nth=2")
    assert rows.evaluate(axis) != before  # the hovered token is drawn apart
    assert set(tab.eval_on_selector_all("#text0 canvas.heat", "cs => cs.map(c => c.dataset.row)")) == {"2"}
    assert "looks at" in tab.locator("#text0 .hover").text_content()
    tab.locator("#text0 canvas.heat").first.hover(position={"x": 3, "y": 3})
    assert 'query "w1" → key "w1"' in tab.locator("#text0 .hover").text_content() and errors == []


def test_screenshot_is_not_blank(report, tmp_path):
    tab, _, _, _ = report
    path = Path(os.environ.get("REPORT_SCREENSHOT") or tmp_path / "report.png")
    tab.mouse.move(0, 0)
    tab.screenshot(path=str(path), full_page=True)
    from PIL import Image

    image = Image.open(path).convert("L")
    low, high = image.getextrema()
    assert high - low > 100 and len(set(image.resize((64, 64)).getdata())) > 20
