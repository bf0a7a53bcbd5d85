"""serve.py as a real server process on a free port, spoken to over HTTP: the answers are predict.py's, bad requests
get a 4xx JSON error and the server keeps serving; the page in headless chromium (skips without it: `make browser`).

One server per module. SERVE_CKPT=path runs the same tests against a trained checkpoint instead of the tiny random
one; SERVE_SCREENSHOT=docs/serve_page.png keeps the page's screenshot (the README's is taken that way).
"""

import http.client
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import predict
from conftest import ROOT, save_checkpoint, tiny_classifier

pytestmark = pytest.mark.slow  # a server process with its worker
MAX_TEXTS, MAX_BYTES = 4, 4000
CHROMIUM = os.environ.get("CHROMIUM", shutil.which("chromium") or shutil.which("chromium-browser") or "")
TEXTS = ["w1 alpha w2 beta w3", "beta 好 差 alpha", "   ", "w5 w6"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    if os.environ.get("SERVE_CKPT"):
        return os.environ["SERVE_CKPT"]
    return str(save_checkpoint(tiny_classifier(), tmp_path_factory.mktemp("serve") / "tiny.ckpt"))


@pytest.fixture(scope="module")
def server_process(ckpt, tmp_path_factory):
    """(port, the serve.py process, its log file)."""
    port = free_port()
    log = tmp_path_factory.mktemp("serve_log") / "serve.log"
    command = [sys.executable, str(ROOT / "serve.py"), "--ckpt", ckpt, "--port", str(port),
               "--max-texts", str(MAX_TEXTS), "--max-bytes", str(MAX_BYTES), "--ig-steps", "8"]
    process = subprocess.Popen(command, cwd=ROOT, stdout=open(log, "wb"), stderr=subprocess.STDOUT,
                               start_new_session=True)  # its own group: its workers are stopped with it
    try:
        deadline = time.monotonic() + 120
        while get(port, "/health")[0] != 200:
            assert process.poll() is None, f"serve.py exited with {process.returncode}: {log.read_text()[-2000:]}"
            assert time.monotonic() < deadline, f"serve.py not healthy after 120 s: {log.read_text()[-2000:]}"
            time.sleep(0.3)
        yield port, process, log
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def server(server_process):
    return server_process[0]


def request(port: int, method: str, path: str, body: bytes | None = None, headers=None) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        connection.request(method, path, body=body, headers=headers or {})
        response = connection.getresponse()
        return response.status, response.read()
    except OSError:
        return 0, b""
    finally:
        connection.close()


def get(port, path):
    return request(port, "GET", path)


def post(port, payload) -> tuple[int, dict]:
    body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    status, answer = request(port, "POST", "/predict", body, {"Content-Type": "application/json"})
    return status, json.loads(answer)


def predict_py(capsys, ckpt, *args) -> list[dict]:
    assert predict.main(["--ckpt", ckpt, *args]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def assert_same(served: list[dict], printed: list[dict]):
    """The same objects; probabilities and weights to float32 precision (other batch-mates, other padding)."""
    assert len(served) == len(printed)
    for a, b in zip(served, printed):
        assert a.keys() == b.keys() and a.get("label") == b.get("label") and a["text"] == b["text"]
        assert a.get("error") == b.get("error") and a.get("tokens") == b.get("tokens")
        for name, p in b.get("probabilities", {}).items():
            assert a["probabilities"][name] == pytest.approx(p, abs=1e-5)
        if "attention" in b:
            assert json.dumps(a["attention"]).count(",") == json.dumps(b["attention"]).count(",")
            flat_a = json.loads(json.dumps(a["attention"]).replace("[", "").replace("]", "").join("[]"))
            flat_b = json.loads(json.dumps(b["attention"]).replace("[", "").replace("]", "").join("[]"))
            assert flat_a == pytest.approx(flat_b, abs=1e-5)


def test_predictions_are_predict_pys_objects(server, ckpt, capsys):
    status, answer = post(server, {"texts": TEXTS})
    assert status == 200 and answer["notes"] == []
    assert_same(answer["predictions"], predict_py(capsys, ckpt, *TEXTS))
    assert answer["predictions"][2] == {"text": "   ", "error": "empty text"}


def test_attention_and_explanations_are_predict_pys_too(server, ckpt, capsys):
    status, answer = post(server, {"texts": TEXTS[:2], "attention": True})
    assert status == 200
    assert_same(answer["predictions"], predict_py(capsys, ckpt, "--attention", *TEXTS[:2]))
    status, answer = post(server, {"texts": TEXTS[:1], "explain": True})
    printed = predict_py(capsys, ckpt, "--explain", "--ig-steps", "8", TEXTS[0])
    assert status == 200 and answer["predictions"][0]["scores"].keys() == printed[0]["scores"].keys()
    assert answer["predictions"][0]["label"] == printed[0]["label"]
    assert answer["predictions"][0]["scores"]["occlusion"] == pytest.approx(printed[0]["scores"]["occlusion"], abs=1e-5)


def test_a_text_over_max_length_is_truncated_and_said_so(server):
    max_length = json.loads(get(server, "/info")[1])["model"]["max_length"]
    long_text = " ".join(f"w{i % 20}" for i in range(max_length + 8))
    status, answer = post(server, {"texts": [long_text]})
    assert status == 200 and answer["predictions"][0]["truncated_from"] == max_length + 8
    assert answer["notes"] == [f"text 0: {max_length + 8} tokens, truncated to the model's max_length of {max_length}"]


def test_health_and_metadata(server):
    assert get(server, "/health") == (200, b"ok")
    status, body = get(server, "/info")
    model = json.loads(body)["model"]
    assert status == 200 and model["attention"] == "full" and model["ensemble"] is False
    assert model["labels"] and isinstance(model["max_length"], int)
    assert {"epochs", "global_step"} <= set(model["checkpoints"][0]["training"])


def test_info_tells_the_limits_that_hold(server):
    limits = json.loads(get(server, "/info")[1])["server"]
    assert limits["max_texts"] == MAX_TEXTS and limits["max_bytes"] == MAX_BYTES and limits["ig_steps"] == 8
    assert limits["request_timeout"] == 120 and "timeout" not in limits and "max_payload_size" not in limits
    assert post(server, {"texts": ["a"] * limits["max_texts"]})[0] == 200
    assert post(server, {"texts": ["a"] * (limits["max_texts"] + 1)})[0] == 422


def test_info_names_the_files_a_model_was_trained_on():
    from inference.answers import training_figures

    data = {"dataset": "sst2", "train_file": "good.csv", "val_file": None}  # the dataset name: a default, ignored
    figures = training_figures({"epoch": 1, "global_step": 8, "datamodule_hyper_parameters": data})
    assert figures["train_file"] == "good.csv" and "dataset" not in figures
    figures = training_figures({"datamodule_hyper_parameters": {"dataset": "imdb", "train_file": None}})
    assert figures["dataset"] == "imdb" and "train_file" not in figures


POISON = b'{"texts": ["\\ud800 lone surrogate", "w1 alpha"]}'  # valid JSON; the text is not Unicode


def test_a_text_that_cannot_be_encoded_fails_no_other_request(server):
    status, answer = post(server, POISON)
    assert status == 200 and answer["predictions"][1]["label"]
    assert answer["predictions"][0] == {"text": "\ufffd lone surrogate", "error": answer["predictions"][0]["error"]}
    assert "lone surrogate U+D800" in answer["predictions"][0]["error"]

    def valid(i):
        return post(server, {"texts": [f"w{i % 9} alpha beta", "w2 w3"]})[0]

    def poison(_):
        return post(server, POISON)[0]

    with ThreadPoolExecutor(16) as pool:  # requests batched across clients, the poison among them
        futures = [pool.submit(poison if i % 4 == 0 else valid, i) for i in range(160)]
        statuses = [future.result() for future in futures]
    assert statuses == [200] * len(statuses)


@pytest.mark.parametrize("body, status, says", [
    (b'{"texts": ["a"', 400, "not valid JSON"),
    (b"\xff\xfe", 400, "not valid JSON"),
    ([1, 2], 422, "must be a JSON object"),
    ({}, 422, 'missing field "texts"'),
    ({"texts": "just one"}, 422, '"texts" must be a list of strings, not str'),
    ({"texts": ["a", 3]}, 422, "not a string at position(s) 1"),
    ({"texts": ["a"], "attention": "yes"}, 422, '"attention" must be a boolean'),
    ({"texts": ["a"], "explain": 1}, 422, '"explain" must be a boolean'),
    ({"texts": []}, 422, '"texts" is empty'),
    ({"texts": ["a"] * (MAX_TEXTS + 1)}, 422, f"at most {MAX_TEXTS} per request"),
    ({"texts": ["a"], "ckpt": "/etc/passwd"}, 422, 'unknown field "ckpt"'),
    ({"texts": ["a" * MAX_BYTES]}, 413, f"over {MAX_BYTES} bytes"),
])
def test_a_bad_request_gets_a_4xx_json_error_and_the_server_keeps_serving(server, body, status, says):
    got, answer = post(server, body)
    assert got == status and says in answer["error"]
    assert post(server, {"texts": ["w1 alpha"]})[0] == 200


def test_the_page_is_self_contained(server):
    status, body = get(server, "/")
    page = body.decode()
    assert status == 200 and "<textarea" in page and "drawMap" in page
    assert "<script src" not in page and "<link" not in page and "http://" not in page and "https://" not in page


@pytest.fixture(scope="module")
def tab(server):
    if not CHROMIUM:
        pytest.skip("no chromium installed: `make browser` installs Debian's chromium (root, apt)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright not installed: pip install -e '.[dev]'")
    errors, external = [], []
    origin = f"http://127.0.0.1:{server}"
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1100, "height": 900})
        page.on("console", lambda message: message.type == "error" and errors.append(message.text))
        page.on("pageerror", lambda error: errors.append(str(error)))
        page.on("request", lambda r: r.url.startswith(origin) or external.append(r.url))
        page.goto(origin + "/")
        yield page, errors, external
        browser.close()


def test_typing_a_text_shows_its_label_tokens_and_heatmaps(tab, server):
    page, errors, external = tab
    text = "the acting is wonderful but the plot is dull 好"
    page.fill("#input", text)
    page.click("#submit")
    page.wait_for_selector("#text0 canvas.heat", timeout=60_000)
    label = page.locator("#text0 .label").text_content()
    expected = post(server, {"texts": [text]})[1]["predictions"][0]["label"]
    assert label == f"predicted: {expected}"
    info = json.loads(get(server, "/info")[1])["model"]["checkpoints"][0]["network"]
    assert page.locator("#text0 canvas.heat").count() == info["n_layers"] * info["n_heads"]
    assert "好" in page.locator("#text0 p").first.text_content()
    page.click("#switch button[data-method='occlusion']")
    page.hover("#text0 .tok >> nth=1")
    assert "looks at" in page.locator("#text0 .hover").text_content()
    assert errors == [] and external == []


def test_screenshot_of_the_served_page(tab, tmp_path):
    page, errors, _ = tab
    path = Path(os.environ.get("SERVE_SCREENSHOT") or tmp_path / "serve_page.png")
    page.screenshot(path=str(path), full_page=True)
    from PIL import Image

    image = Image.open(path).convert("L")
    low, high = image.getextrema()
    assert high - low > 100 and len(set(image.resize((64, 64)).getdata())) > 20 and errors == []


def test_an_ensemble_answers_averaged_probabilities_and_refuses_attention(tmp_path):
    from inference.answers import answer_batch
    from inference.ensemble import Ensemble
    from inference.limits import ServerLimits
    from inference.request import BadRequest, PredictRequest, parse_request

    members = [tiny_classifier(seed=seed) for seed in (0, 1)]
    answers = answer_batch(Ensemble(members), [PredictRequest(texts=["w1 alpha", " "])])
    first, second = (m.predict(["w1 alpha"])[0].probabilities for m in members)
    served = answers[0]["predictions"]
    assert served[0]["probabilities"]["pos"] == pytest.approx((first["pos"] + second["pos"]) / 2, abs=1e-6)
    assert served[1] == {"text": " ", "error": "empty text"}
    with pytest.raises(BadRequest, match="attention belongs to one network"):
        parse_request(b'{"texts": ["a"], "attention": true}', ServerLimits(), ensemble=True)


def test_a_request_the_model_fails_on_fails_alone():
    from inference.answers import answer_batch
    from inference.request import PredictRequest

    classifier = tiny_classifier()
    predict = classifier.predict

    def breaks_on_boom(texts, **options):
        if any("boom" in text for text in texts):
            raise RuntimeError("a fault this text causes")
        return predict(texts, **options)

    classifier.predict = breaks_on_boom
    requests = [PredictRequest(texts=["w1 alpha"]), PredictRequest(texts=["boom w2"]),
                PredictRequest(texts=["w3", "beta"], attention=True)]
    answers = answer_batch(classifier, requests)
    (failed,) = answers[1]["predictions"]  # the text's own error entry (docs/SERVING.md)
    assert failed == {"text": "boom w2", "error": "the model failed on this text: RuntimeError: a fault this text "
                                                  "causes"}
    assert answers[0]["predictions"][0]["probabilities"] == predict(["w1 alpha"])[0].probabilities
    assert [p["label"] for p in answers[2]["predictions"]] == [p.label for p in predict(["w3", "beta"])]


def test_bad_command_lines_are_one_line_errors(tmp_path, capsys):
    import serve

    assert serve.main(["--ckpt", str(tmp_path / "missing.ckpt")]) == 2
    (tmp_path / "junk.ckpt").write_bytes(b"not a checkpoint")
    assert serve.main(["--ckpt", str(tmp_path / "junk.ckpt")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "file not found" in lines[0] and "not a checkpoint written by train.py" in lines[1]


@pytest.mark.parametrize("flags, says", [
    (["--ig-steps", "100000"], "argument --ig-steps: must be in 1..1024, got 100000"),
    (["--port", "80"], "argument --port: must be in 1024..65535, got 80"),
    (["--port", "70000"], "argument --port: must be in 1024..65535, got 70000"),
    (["--host", "10.1.2.3"], "argument --host: must be 127.0.0.1"),
    (["--host", "localhost"], "argument --host: must be 127.0.0.1"),
    (["--request-timeout", "0"], "argument --request-timeout: must be in"),
    (["--batch-timeout", "3", "--request-timeout", "2"], "--batch-timeout (3) must be less than --request-timeout"),
    (["--max-texts", "0"], "argument --max-texts: must be in 1..65536, got 0"),
])
def test_every_argument_is_checked_before_anything_loads(flags, says, capsys):
    import serve

    with pytest.raises(SystemExit) as stop:
        serve.main(["--ckpt", "missing.ckpt", *flags])  # the checkpoint is never looked at
    lines = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and says in lines[-1] and "missing.ckpt" not in lines[-1]


def test_a_device_the_machine_lacks_is_one_line_before_any_checkpoint_is_read(capsys, monkeypatch):
    import torch

    import serve

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert serve.main(["--ckpt", "missing.ckpt", "--device", "cuda"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: device cuda asked for, but CUDA is not available on this machine (use --device cpu or "
                     "auto)"]


def test_the_monitors_lost_manager_at_a_stop_is_not_logged_but_its_other_failures_are():
    import serve

    def record(error):
        try:
            raise error
        except Exception:
            return logging.LogRecord("litserve.server", logging.ERROR, __file__, 1, "Monitoring worker crashed", None,
                                     sys.exc_info())
    quiet = serve.QuietMonitorAtStop()
    assert not quiet.filter(record(ConnectionRefusedError(111, "Connection refused")))
    assert not quiet.filter(record(EOFError()))
    assert quiet.filter(record(RuntimeError("a real failure")))


def test_serve_without_the_serve_extra_says_how_to_install_it(monkeypatch):
    import runpy

    monkeypatch.setitem(sys.modules, "litserve", None)  # as if not installed
    monkeypatch.setattr(sys, "argv", ["serve.py", "--ckpt", "x.ckpt"])
    with pytest.raises(SystemExit) as stop:
        runpy.run_path(str(ROOT / "serve.py"), run_name="__main__")
    message = str(stop.value.code)
    assert "litserve is not installed" in message and 'pip install -e ".[serve]"' in message and "\n" not in message


def test_a_stop_leaves_one_line_at_most_and_no_traceback(server_process):
    """Last in the module: it stops the module's server."""
    port, process, log = server_process
    before = log.read_text().splitlines()
    process.send_signal(signal.SIGTERM)
    assert process.wait(timeout=60) == 0, log.read_text()[-2000:]
    after = log.read_text().splitlines()[len(before):]
    assert len(after) <= 1 and "Traceback" not in log.read_text() and "KeyboardInterrupt" not in log.read_text()
