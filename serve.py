"""Serve a checkpoint over HTTP with LitServe: predictions batched across requests, and a live attention page.

    python serve.py --ckpt lightning_logs/version_0            # http://127.0.0.1:8000/
    curl -s localhost:8000/predict -d '{"texts": ["a charming and affecting journey"]}'

Endpoints: POST /predict, GET / (the explanation page of inference/report.py, asking /predict), GET /health
(LitServe's: "ok" once the workers are ready), GET /info (the model: labels, attention kind, max_length, training
figures). The answers are predict.py's own objects (predict.prediction_outputs / explanation_outputs).
"""

import argparse
import asyncio
import json
import logging
import signal
import sys
from pathlib import Path

import litserve as ls

from predict import at_least, explanation_outputs, finite, prediction_outputs

log = logging.getLogger("serve")

DESCRIPTION = """\
Serve a checkpoint from train.py over HTTP (LitServe: requests are batched across clients in a worker process).

POST /predict  {"texts": [...], "attention": false, "explain": false}  →  {"predictions": [...], "notes": [...]}
    one object per text, the same predict.py prints (an empty text gives {"text", "error": "empty text"}); a text
    longer than max_length tokens is cut to it, as in training: its object gets "truncated_from" and "notes" a line.
    "attention": add tokens and each layer's weights (predict.py --attention); "explain": the five explanation
    methods per token (predict.py --explain; slow: Integrated Gradients and occlusion per text), with "attention"
    each layer's per-head weights. A bad request is a 4xx {"error": "..."}: invalid JSON (400), a missing, unknown
    or wrong-typed field (422), more than --max-texts texts (422), a body over --max-bytes (413); no answer within
    --request-timeout (a worker died: LitServe starts a new one) is a 504.
GET /          a page: type a text, see its label, the tokens shaded by an explanation method, and the attention
               of every layer and head (nothing is fetched from the internet)
GET /health    "ok" when the workers are ready (503 before)
GET /info      {"model": {labels, attention, max_length, training figures, ...}, "server": {...}}

Nothing in a request names a file: the checkpoints are the ones given here. The server listens on 127.0.0.1 (this
machine only) unless --host says otherwise; --host 0.0.0.0 exposes it to the network, without authentication."""

EPILOG = """\
examples:
  python serve.py --ckpt lightning_logs/version_0
  python serve.py --ckpt runs/seed0 --ckpt runs/seed1 --port 8080      # an ensemble: probabilities averaged
  curl -s 127.0.0.1:8000/predict -H 'Content-Type: application/json' -d '{"texts": ["not bad", "dull"]}'
  python bench/serve_load.py --url http://127.0.0.1:8000 --requests 2000 --concurrency 32
"""


def positive_int(value: str) -> int:
    number = int(value)
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return number


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="serve.py", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, action="append", metavar="PATH",
                        help="checkpoint written by train.py, or a run folder (its best checkpoint); given several "
                             "times, an ensemble (probabilities averaged; no attention or explanations)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only; 0.0.0.0: every network "
                             "interface, reachable by anyone who can reach the machine — there is no authentication)")
    parser.add_argument("--port", type=int, default=8000, help="port to listen on (default: 8000)")
    parser.add_argument("--max-texts", type=positive_int, default=64, metavar="N",
                        help="most texts in one request (default: 64)")
    parser.add_argument("--max-bytes", type=positive_int, default=1_000_000, metavar="N",
                        help="largest request body in bytes (default: 1000000)")
    parser.add_argument("--max-batch-size", type=positive_int, default=32, metavar="N",
                        help="most requests a worker answers with one forward pass (default: 32)")
    parser.add_argument("--batch-timeout", type=float, default=0.005, metavar="S",
                        help="seconds a worker waits for more requests to fill a batch (default: 0.005)")
    parser.add_argument("--request-timeout", type=float, default=120.0, metavar="S",
                        help="seconds before a request without an answer gets a 504 (a worker that died mid-request "
                             "never answers; LitServe starts a new one) (default: 120)")
    parser.add_argument("--workers", type=positive_int, default=1, metavar="N",
                        help="inference worker processes, each with its own copy of the model (default: 1)")
    parser.add_argument("--threads", type=positive_int, default=1, metavar="N",
                        help="torch threads per worker (default: 1)")
    parser.add_argument("--ig-steps", type=positive_int, default=32, metavar="N",
                        help="Integrated Gradients steps for explanations (default: 32)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                        help="where the workers run the network (default: cpu)")
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    args = parser.parse_args(argv)
    if args.request_timeout <= 0:
        parser.error(f"--request-timeout must be > 0, got {args.request_timeout}")
    if args.batch_timeout < 0:
        parser.error(f"--batch-timeout must be >= 0, got {args.batch_timeout}")
    if not 0 < args.port < 65536:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    return args


def load_classifier(paths: list[str], device: str):
    """One checkpoint: a TextClassifier; several: an Ensemble (inference.ensemble)."""
    from inference import TextClassifier
    from inference.ensemble import Ensemble, resolve_checkpoint

    if len(paths) == 1:
        return TextClassifier.from_checkpoint(resolve_checkpoint(paths[0]), device=device)
    return Ensemble.from_checkpoints(paths, device=device)


def model_metadata(paths: list[str]) -> dict:
    """What GET /info says about the model, read from the checkpoints (safely: data/checkpoint.py)."""
    from inference.ensemble import resolve_checkpoint
    from data.checkpoint import read_checkpoint, stored_label_names
    from model.config import network_config

    members = []
    for path in paths:
        file = resolve_checkpoint(path)
        checkpoint = read_checkpoint(file)
        labels = stored_label_names(checkpoint)
        config = network_config(checkpoint["hyper_parameters"], labels)
        members.append({"checkpoint": file.name, "labels": labels, "attention": config.attention,
                        "max_length": config.max_length, "network": config.to_dict(),
                        "training": training_figures(checkpoint)})
    first = members[0]
    return {"labels": first["labels"], "attention": first["attention"],
            "max_length": min(member["max_length"] for member in members), "ensemble": len(members) > 1,
            "checkpoints": members}


def training_figures(checkpoint: dict) -> dict:
    """Epochs, steps, the dataset and the monitored validation figure a train.py checkpoint records."""
    figures = {"epochs": checkpoint.get("epoch", -1) + 1, "global_step": checkpoint.get("global_step")}
    data = checkpoint.get("datamodule_hyper_parameters")
    if isinstance(data, dict):
        figures["dataset"] = data.get("dataset") or data.get("train_file")
    for name, state in (checkpoint.get("callbacks") or {}).items():
        if name.startswith("ModelCheckpoint") and isinstance(state, dict) and state.get("monitor"):
            score = state.get("best_model_score")
            figures["monitor"] = state["monitor"]
            figures["best_score"] = None if score is None else round(float(score), 6)
            current = state.get("current_score")
            figures["last_score"] = None if current is None else round(float(current), 6)
    return figures


# ---- requests -----------------------------------------------------------------------------------------------------


class BadRequest(ValueError):
    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


FIELDS = {"texts": list, "attention": bool, "explain": bool}


def check_request(body: bytes, max_texts: int, ensemble: bool) -> dict:
    """The request as a dict with every field set, or BadRequest (status, one line) saying what is wrong."""
    try:
        request = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise BadRequest(400, f"the body is not valid JSON: {e}") from e
    if not isinstance(request, dict):
        raise BadRequest(422, f'the body must be a JSON object {{"texts": [...]}}, not a {type(request).__name__}')
    unknown = sorted(set(request) - set(FIELDS))
    if unknown:
        raise BadRequest(422, f"unknown field(s) {', '.join(map(repr, unknown))}; the fields are "
                              f"{', '.join(map(repr, FIELDS))}")
    if "texts" not in request:
        raise BadRequest(422, 'missing field "texts": a list of strings')
    for field, kind in FIELDS.items():
        if field in request and type(request[field]) is not kind:  # type(): true is not a list, 1 is not a bool
            raise BadRequest(422, f'"{field}" must be a {"list of strings" if kind is list else "boolean"}, not '
                                  f"{type(request[field]).__name__}")
    texts = request["texts"]
    if not texts:
        raise BadRequest(422, '"texts" is empty: give at least one text')
    if len(texts) > max_texts:
        raise BadRequest(422, f'"texts" holds {len(texts)} texts; at most {max_texts} per request (--max-texts)')
    not_text = [str(i) for i, text in enumerate(texts) if not isinstance(text, str)]
    if not_text:
        raise BadRequest(422, f'"texts" must hold strings; not a string at position(s) {", ".join(not_text[:10])}')
    request = {"texts": texts, "attention": request.get("attention", False), "explain": request.get("explain", False)}
    if ensemble and (request["attention"] or request["explain"]):
        raise BadRequest(422, "attention belongs to one network: this server runs an ensemble (several --ckpt)")
    return request


class RequestLimits:
    """ASGI middleware in front of POST /predict: the body's size, its JSON and its fields are checked before any
    worker sees it; a bad request is answered here with a 4xx {"error"} and never reaches the model."""

    def __init__(self, app, *, max_bytes: int, max_texts: int, ensemble: bool, timeout: float):
        self.app, self.max_bytes, self.max_texts, self.ensemble = app, max_bytes, max_texts, ensemble
        self.timeout = timeout

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/predict" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        too_large = BadRequest(413, f"the body is over {self.max_bytes} bytes (--max-bytes)")
        declared = dict(scope["headers"]).get(b"content-length")
        try:
            if declared is not None and int(declared) > self.max_bytes:
                raise too_large
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if len(body) > self.max_bytes:
                    raise too_large
                if not message.get("more_body"):
                    break
            request = check_request(body, self.max_texts, self.ensemble)
        except BadRequest as e:
            return await answer_error(send, e.status, str(e))
        checked = json.dumps(request).encode()
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"content-type")]
        scope = dict(scope, headers=headers + [(b"content-type", b"application/json"),
                                                (b"content-length", str(len(checked)).encode())])
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": checked, "more_body": False}

        started = False

        async def tracked(message):
            nonlocal started
            started = True
            await send(message)

        try:  # a request whose worker died never hears back from LitServe: answer it here
            await asyncio.wait_for(self.app(scope, replay, tracked), self.timeout)
        except asyncio.TimeoutError:
            if not started:
                await answer_error(send, 504, f"no answer within {self.timeout:g} s (--request-timeout): the worker "
                                              "may have died and been restarted; send the request again")


async def answer_error(send, status: int, message: str):
    body = json.dumps({"error": message}, ensure_ascii=False).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# ---- the worker ---------------------------------------------------------------------------------------------------


class ClassifierAPI(ls.LitAPI):
    """One worker: the model loaded once; each batch of requests is answered with one forward pass per kind."""

    def __init__(self, *, checkpoints: list[str], device: str, threads: int, ig_steps: int, **batching):
        super().__init__(**batching)
        self.checkpoints, self.device, self.threads, self.ig_steps = checkpoints, device, threads, ig_steps

    def setup(self, device):
        import torch

        torch.set_num_threads(self.threads)
        self.classifier = load_classifier(self.checkpoints, self.device)
        self.classifier.predict(["warm up"] * 8)  # first-call costs paid before /health says ready

    def decode_request(self, request):
        return request  # already checked by RequestLimits

    def batch(self, requests):
        return requests

    def predict(self, requests):
        return answer_batch(self.classifier, requests, ig_steps=self.ig_steps)

    def unbatch(self, answers):
        return answers

    def encode_response(self, answer):
        return answer


def answer_batch(classifier, requests: list[dict], ig_steps: int = 32) -> list[dict]:
    """The answers to a batch of checked requests, in order: the texts of all requests that ask for the same
    thing go through the model together (predict.py's prediction_outputs), explanations one request at a time."""

    answers: list[dict | None] = [None] * len(requests)
    for attention in (False, True):
        group = [i for i, r in enumerate(requests) if not r["explain"] and r["attention"] == attention]
        if not group:
            continue
        texts = [text for i in group for text in requests[i]["texts"]]
        pairs = iter(prediction_outputs(classifier, texts, attention=attention))
        for i in group:
            answers[i] = answer(classifier, [next(pairs) for _ in requests[i]["texts"]])
    for i, request in enumerate(requests):
        if request["explain"]:
            answers[i] = answer(classifier, explanation_outputs(classifier, request["texts"],
                                                                attention=request["attention"], ig_steps=ig_steps))
    return answers


def answer(classifier, pairs: list[tuple]) -> dict:
    """{"predictions": the objects (NaN/inf ones as errors), "notes": a line per truncated text}."""
    notes = [f"text {i}: {at_least(out['text'])}{result.truncated_from} tokens, truncated to the model's max_length "
             f"of {classifier.max_length}" for i, (out, result) in enumerate(pairs)
             if result is not None and result.truncated_from is not None]
    return {"predictions": [finite(out) for out, _ in pairs], "notes": notes}


# ---- the server ---------------------------------------------------------------------------------------------------


def build_server(args, metadata: dict):
    from fastapi.responses import HTMLResponse, JSONResponse, Response
    from starlette.exceptions import HTTPException

    from inference.report import live_page

    api = ClassifierAPI(checkpoints=args.ckpt, device=args.device, threads=args.threads, ig_steps=args.ig_steps,
                        max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
    server = ls.LitServer(
        api, accelerator="cpu" if args.device == "cpu" else "auto", workers_per_device=args.workers,
        model_metadata=metadata, restart_workers=True, disable_openapi_url=True, timeout=60,
        middlewares=[(RequestLimits, {"max_bytes": args.max_bytes, "max_texts": args.max_texts,
                                      "ensemble": metadata["ensemble"], "timeout": args.request_timeout})],
    )
    app = server.app
    app.router.routes = [route for route in app.router.routes if getattr(route, "path", None) != "/"]
    page = live_page(metadata)
    app.add_api_route("/", lambda: HTMLResponse(page), methods=["GET"])
    app.add_api_route("/favicon.ico", lambda: Response(status_code=204), methods=["GET"])  # browsers ask for it

    async def error_as_json(request, exc: HTTPException):  # LitServe's 500/504: {"error"} like the 4xx answers
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    app.add_exception_handler(HTTPException, error_as_json)
    return server


def interrupt(signum, frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        from inference.ensemble import resolve_checkpoint

        for path in args.ckpt:  # a missing or unsafe checkpoint: one line before any worker starts
            if not Path(path).exists():
                raise ValueError(f"{path}: file not found")
            resolve_checkpoint(path)
        metadata = model_metadata(args.ckpt)
        load_classifier(args.ckpt, "cpu")  # a checkpoint the workers cannot load fails here, with one line
    except ValueError as e:  # CheckpointError and friends
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = build_server(args, metadata)
    # SIGTERM (and SIGINT, which a shell ignores in a background job) ends through LitServe's graceful shutdown,
    # which stops the worker processes too.
    for stop in (signal.SIGINT, signal.SIGTERM):
        signal.signal(stop, interrupt)
    log.info("serving %s on http://%s:%d/ (GET / for the page, POST /predict)", ", ".join(args.ckpt), args.host,
             args.port)
    server.run(host=args.host, port=args.port, num_api_servers=1, generate_client_file=False, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
