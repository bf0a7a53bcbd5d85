"""The explanation page (inference/report.py) in a real headless browser: Debian's chromium driven by Playwright.

Skips, saying why, where chromium or the playwright package is missing: `make browser` installs both (root, apt).
Set REPORT_SCREENSHOT=path.png to keep the screenshot for a look.
"""

import os
import shutil
from pathlib import Path

import pytest

from inference.report import write_report
from conftest import tiny_classifier

CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or shutil.which("chromium-browser") or "")


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    if not CHROMIUM:
        pytest.skip("no chromium installed: `make browser` installs Debian's chromium (root, apt)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed: pip install -e '.[dev]'")
    classifier = tiny_classifier()
    path = tmp_path_factory.mktemp("report") / "report.html"
    write_report(classifier.explain(["w1 alpha w2 beta w3 w4", "好 差 w5 差 好"]), path)
    errors, requests = [], []
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1100, "height": 900})
        tab.on("console", lambda message: message.type == "error" and errors.append(message.text))
        tab.on("pageerror", lambda error: errors.append(str(error)))
        tab.on("request", lambda request: request.url.startswith("file:") or requests.append(request.url))
        tab.goto(path.as_uri())
        tab.wait_for_selector("canvas")
        yield tab, errors, requests
        browser.close()


def colours(tab):
    return tab.eval_on_selector_all("#text0 .tok", "els => els.map(e => getComputedStyle(e).backgroundColor)")


def test_page_loads_without_console_errors_or_requests(page):
    tab, errors, requests = page
    assert errors == [] and requests == []
    assert tab.locator("#text1 .tok").first.text_content() == "好"
    assert tab.locator("canvas").count() == 2 * 2 * 2  # texts × layers × heads


def test_the_method_switch_changes_the_shading(page):
    tab, errors, _ = page
    tab.click("#switch button[data-method='attention']")
    attention = colours(tab)
    tab.click("#switch button[data-method='occlusion']")
    occlusion = colours(tab)
    assert attention != occlusion
    assert tab.locator("#switch button.active").get_attribute("data-method") == "occlusion"
    assert "replaced by [UNK]" in tab.locator("#text0 .method-note").text_content() and errors == []


def test_hovering_a_token_outlines_its_row_in_every_heatmap(page):
    tab, errors, _ = page
    canvas = "#text0 canvas"
    pixels = "c => Array.from(c.getContext('2d').getImageData(0, 0, c.width, c.height).data.slice(0, 40000)).join()"
    before = tab.eval_on_selector(canvas, pixels)
    tab.hover("#text0 .tok >> nth=2")
    assert tab.eval_on_selector(canvas, pixels) != before
    assert set(tab.eval_on_selector_all("#text0 canvas", "cs => cs.map(c => c.dataset.row)")) == {"2"}
    assert "looks at" in tab.locator("#text0 .hover").text_content()
    assert "tok hl" in tab.eval_on_selector("#text0 .tok >> nth=2", "e => e.className") and errors == []


def test_screenshot_is_not_blank(page, tmp_path):
    tab, _, _ = page
    path = Path(os.environ.get("REPORT_SCREENSHOT") or tmp_path / "report.png")
    tab.screenshot(path=str(path), full_page=True)
    from PIL import Image

    image = Image.open(path).convert("L")
    low, high = image.getextrema()
    assert high - low > 100 and len(set(image.resize((64, 64)).getdata())) > 20
