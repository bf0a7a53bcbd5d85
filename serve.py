"""Serve a checkpoint over HTTP with LitServe: predictions batched across requests, and a live attention page.

    python serve.py --ckpt lightning_logs/version_0            # http://127.0.0.1:8000/
    curl -s localhost:8000/predict -d '{"texts": ["a charming and affecting journey"]}'

Endpoints: POST /predict, GET / (the explanation page of inference/report.py, asking /predict), GET /health
(LitServe's: "ok" once the workers are ready), GET /info (the model: labels, attention kind, max_length, training
figures; the limits that hold). This file only parses arguments and carries requests and answers: the request model
and its limits are inference/request.py and inference/limits.py, the answers (the objects predict.py prints)
inference/answers.py, the page inference/report.py.
"""

import argparse
import asyncio
import json
import logging
import multiprocessing
import signal
import sys
from pathlib import Path

import runtime

try:
    import litserve as ls
except ModuleNotFoundError as e:  # the serve extra is not installed: one line saying how to install it
    sys.exit(f"error: serve.py needs the serve extra ({e.name} is not installed): pip install -e \".[serve]\"")

from inference.limits import BATCH_SIZE, BATCH_TIMEOUT, IG_STEPS, PORT, POSITIVE, REQUEST_BYTES, REQUEST_TIMEOUT, \
    TEXTS_PER_REQUEST, ServerLimits, host
from inference.faces import add_class_arguments, check_class_arguments
from inference.request import BadRequest, PredictRequest, parse_request

log = logging.getLogger("serve")

DESCRIPTION = """\
Serve a checkpoint from train.py over HTTP (LitServe: requests are batched across clients in a worker process).

POST /predict  {"texts": [...], "attention": false, "explain": false}  →  {"predictions": [...], "notes": [...]}
    one object per text, the same predict.py prints (a text the model cannot read, empty or not Unicode, gives
    {"text", "error"} in its place, the other texts answered as usual); a text
    longer than max_length tokens is cut to it, as in training: its object gets "truncated_from" and "notes" a line.
    "attention": add tokens and each layer's weights (predict.py --attention); "explain": the five explanation
    methods per token (predict.py --explain; slow: Integrated Gradients and occlusion per text), with "attention"
    each layer's per-head weights. A bad request is a 4xx {"error": "..."}: invalid JSON (400), a missing, unknown
    or wrong-typed field (422), more than --max-texts texts (422), a body over --max-bytes (413); no answer within
    --request-timeout (a worker died: LitServe starts a new one) is a 504; a text the model fails on gets
    {"text", "error"} in its place, the other texts their answers; a request every text of which fails alike is a
    500 {"error"} for that request alone.
GET /          a page: type a text, see its label, the tokens shaded by an explanation method, and the attention
               of every layer and head (nothing is fetched from the internet)
GET /health    "ok" when the workers are ready (the port accepts connections only once they are; 503 while a
               worker that died is restarted)
GET /info      {"model": {labels, attention, max_length, training figures, ...}, "server": {the limits that hold}}
               a model of several labels a text: "multi_label": true and "thresholds": {label: the probability a
               label needs to be in an answer's "labels"} (an ensemble's averaged, as it answers)

Nothing in a request names a file: the checkpoints are the ones given here. The server listens on 127.0.0.1 (this
machine only) unless --host says otherwise; --host 0.0.0.0 exposes it to the network, without authentication."""

EPILOG = """\
examples:
  python serve.py --ckpt lightning_logs/version_0
  python serve.py --ckpt runs/seed0 --ckpt runs/seed1 --port 8080      # an ensemble: probabilities averaged
  curl -s 127.0.0.1:8000/predict -H 'Content-Type: application/json' -d '{"texts": ["not bad", "dull"]}'
  python -m bench.timing serve --url http://127.0.0.1:8000 --requests 2000 --concurrency 32
"""


def parse_args(argv=None) -> argparse.Namespace:
    """The arguments, each checked against inference/limits.py before anything loads (argparse: one line naming
    the flag, exit status 2)."""
    defaults = ServerLimits()
    parser = argparse.ArgumentParser(prog="serve.py", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ckpt", required=True, action="append", metavar="PATH",
                        help="checkpoint written by train.py, or a run folder (its best checkpoint); given several "
                             "times, an ensemble (probabilities averaged; no attention or explanations)")
    parser.add_argument("--host", type=host, default="127.0.0.1",
                        help="address to listen on: 127.0.0.1 (default: this machine only), 0.0.0.0 or :: (every "
                             "interface, reachable by anyone who can reach the machine: there is no authentication)")
    parser.add_argument("--port", type=PORT.argument(), default=8000, help=f"port to listen on, {PORT} (default: 8000)")
    parser.add_argument("--max-texts", type=TEXTS_PER_REQUEST.argument(), default=defaults.max_texts, metavar="N",
                        help=f"most texts in one request, {TEXTS_PER_REQUEST} (default: {defaults.max_texts})")
    parser.add_argument("--max-bytes", type=REQUEST_BYTES.argument(), default=defaults.max_bytes, metavar="N",
                        help=f"largest request body in bytes, {REQUEST_BYTES} (default: {defaults.max_bytes})")
    parser.add_argument("--max-batch-size", type=BATCH_SIZE.argument(), default=defaults.max_batch_size, metavar="N",
                        help=f"most requests a worker answers with one forward pass, {BATCH_SIZE} (default: "
                             f"{defaults.max_batch_size})")
    parser.add_argument("--batch-timeout", type=BATCH_TIMEOUT.argument(float), default=defaults.batch_timeout,
                        metavar="S", help="seconds a worker waits for more requests to fill a batch, "
                                          f"{BATCH_TIMEOUT} (default: {defaults.batch_timeout})")
    parser.add_argument("--request-timeout", type=REQUEST_TIMEOUT.argument(float), default=defaults.request_timeout,
                        metavar="S", help="seconds before a request without an answer gets a 504 (a worker that died "
                                          "mid-request never answers; LitServe starts a new one), "
                                          f"{REQUEST_TIMEOUT} (default: {defaults.request_timeout:g})")
    parser.add_argument("--workers", type=POSITIVE.argument(), default=1, metavar="N",
                        help="inference worker processes, each with its own copy of the model (default: 1)")
    parser.add_argument("--threads", type=POSITIVE.argument(), default=1, metavar="N",
                        help="torch threads per worker (default: 1)")
    parser.add_argument("--ig-steps", type=IG_STEPS.argument(), default=defaults.ig_steps, metavar="N",
                        help=f"Integrated Gradients steps for explanations, {IG_STEPS} (default: {defaults.ig_steps})")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="cpu",
                        help="where the workers run the network (default: cpu)")
    add_class_arguments(parser)
    parser.add_argument("--debug", action="store_true", help="show the full traceback on errors")
    args = parser.parse_args(argv)
    check_class_arguments(parser, args)
    try:
        args.limits = ServerLimits(max_texts=args.max_texts, max_bytes=args.max_bytes,
                                   request_timeout=args.request_timeout, ig_steps=args.ig_steps,
                                   max_batch_size=args.max_batch_size, batch_timeout=args.batch_timeout)
    except ValueError as e:  # settings that are fine alone but not together
        parser.error(str(e))
    return args


# ---- requests -----------------------------------------------------------------------------------------------------


class RequestLimits:
    """ASGI middleware in front of POST /predict: the body's size, its JSON and its fields are checked before any
    worker sees it; a bad request is answered here with a 4xx {"error"} and never reaches the model."""

    def __init__(self, app, *, limits: ServerLimits, ensemble: bool):
        self.app, self.limits, self.ensemble = app, limits, ensemble

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/predict" or scope["method"] != "POST":
            return await self.app(scope, receive, send)
        max_bytes, timeout = self.limits.max_bytes, self.limits.request_timeout
        too_large = BadRequest(413, f"the body is over {max_bytes} bytes (--max-bytes)")
        declared = dict(scope["headers"]).get(b"content-length")
        try:
            if declared is not None and int(declared) > max_bytes:
                raise too_large
            body = b""
            while True:
                message = await receive()
                body += message.get("body", b"")
                if len(body) > max_bytes:
                    raise too_large
                if not message.get("more_body"):
                    break
            parse_request(body, self.limits, self.ensemble)
        except BadRequest as e:
            return await answer_json(send, e.status, {"error": str(e)})
        headers = [(k, v) for k, v in scope["headers"] if k not in (b"content-length", b"content-type")]
        scope = dict(scope, headers=headers + [(b"content-type", b"application/json"),
                                                (b"content-length", str(len(body)).encode())])
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        started = False

        async def tracked(message):
            nonlocal started
            started = True
            await send(message)

        try:  # a request whose worker died never hears back from LitServe: answer it here
            await asyncio.wait_for(self.app(scope, replay, tracked), timeout)
        except asyncio.TimeoutError:
            if not started:
                await answer_json(send, 504, {"error": f"no answer within {timeout:g} s (--request-timeout): the "
                                                       "worker may have died and been restarted; send the request "
                                                       "again"})


async def answer_json(send, status: int, content: dict):
    body = json.dumps(content, ensure_ascii=False).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


# ---- the worker ---------------------------------------------------------------------------------------------------


class ClassifierAPI(ls.LitAPI):
    """One worker: the model loaded once; each batch of requests is answered by inference.answers.answer_batch."""

    def __init__(self, *, checkpoints: list[str], device: str, threads: int, ig_steps: int,
                 attention_class: str | None = None, allow_changed_class: bool = False, **batching):
        super().__init__(**batching)
        self.checkpoints, self.device, self.threads, self.ig_steps = checkpoints, device, threads, ig_steps
        # The class the user named on the command (never one a checkpoint names): each worker names it again.
        self.named = {"attention": attention_class, "allow_changed": allow_changed_class}

    def setup(self, device):
        import torch

        from inference.answers import load

        # Ctrl-C reaches every process of the terminal's group; the server stops its workers itself.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        torch.set_num_threads(self.threads)
        self.classifier = load(self.checkpoints, self.device, **self.named)
        self.classifier.predict(["warm up"] * 8)  # first-call costs paid before /health says ready

    def decode_request(self, request: PredictRequest) -> PredictRequest:
        return request  # checked by RequestLimits, typed by FastAPI

    def batch(self, requests):
        return requests

    def predict(self, requests):
        from inference.answers import answer_batch

        return answer_batch(self.classifier, requests, ig_steps=self.ig_steps)

    def unbatch(self, answers):
        return answers

    def encode_response(self, answer):
        from fastapi.responses import JSONResponse

        # {"error"}: the model failed on this request alone (answer_batch); the others of its batch are answered.
        return JSONResponse(answer, status_code=500) if "error" in answer else answer


# ---- the server ---------------------------------------------------------------------------------------------------


class Server(ls.LitServer):
    """LitServe's server with this project's GET / (the page) and GET /info (the model and the limits that hold).
    They are registered before LitServe's own routes, and a path's first route answers it (LitServe keeps a
    placeholder at / and reports its own settings, not these, at /info)."""

    def __init__(self, api, *, page: str, info: dict, **options):
        self.page, self.info = page, info
        super().__init__(api, **options)

    def register_endpoints(self):
        from fastapi.responses import HTMLResponse, JSONResponse, Response

        self.app.add_api_route("/", lambda: HTMLResponse(self.page), methods=["GET"])
        self.app.add_api_route("/info", lambda: JSONResponse(self.info), methods=["GET"])
        self.app.add_api_route("/favicon.ico", lambda: Response(status_code=204), methods=["GET"])  # browsers ask
        super().register_endpoints()


def build_server(args, model: dict) -> Server:
    from fastapi.responses import JSONResponse
    from starlette.exceptions import HTTPException

    from inference.report import live_page

    limits = args.limits
    api = ClassifierAPI(checkpoints=args.ckpt, device=args.device, threads=args.threads, ig_steps=limits.ig_steps,
                        attention_class=args.attention_class, allow_changed_class=args.allow_changed_class,
                        max_batch_size=limits.max_batch_size, batch_timeout=limits.batch_timeout)
    info = {"model": model, "server": {**limits.to_dict(), "workers": args.workers, "threads": args.threads,
                                       "device": args.device}}
    server = Server(
        api, page=live_page(model), info=info, accelerator="cpu" if args.device == "cpu" else "auto",
        workers_per_device=args.workers, restart_workers=True, disable_openapi_url=True,
        timeout=limits.request_timeout,  # LitServe's own: a request that waited this long in its queue gets a 504
        middlewares=[(RequestLimits, {"limits": limits, "ensemble": model["ensemble"]})],
    )

    async def error_as_json(request, exc: HTTPException):  # LitServe's 500/504: {"error"} like the 4xx answers
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    server.app.add_exception_handler(HTTPException, error_as_json)
    return server


class QuietMonitorAtStop(logging.Filter):
    """LitServe's worker monitor (a thread) asks the multiprocessing manager, a process of its own, whether to stop.
    A stop signal sent to the whole process group (Ctrl-C, `kill -- -PGID`, a service manager) can end the manager
    before the monitor's next question, which then fails with a lost connection, logged as "Monitoring worker
    crashed" with a traceback. That path is the stop itself, so it is not logged; any other failure still is."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not (record.getMessage() == "Monitoring worker crashed" and isinstance(error, (EOFError, OSError)))


def stop(signum, frame):
    """SIGTERM or SIGINT: the main process stops through LitServe's graceful shutdown (it stops the workers too).
    The HTTP process forked from it inherits this handler, and uvicorn raises the signal again once it has shut
    down: that process just exits, without a KeyboardInterrupt traceback."""
    if multiprocessing.parent_process() is not None:
        raise SystemExit(0)
    raise KeyboardInterrupt


def main(argv=None) -> int:
    args = parse_args(argv)
    runtime.configure()  # before torch loads (runtime.py); the workers inherit the pool's wait
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        from inference.answers import load, model_info
        from inference.classifier import resolve_device

        resolve_device(args.device)
        for path in args.ckpt:
            if not Path(path).exists():
                raise ValueError(f"{path}: file not found")
        named = {"attention": args.attention_class, "allow_changed": args.allow_changed_class}
        model = model_info(args.ckpt, **named)  # a missing or unsafe checkpoint: one line before any worker starts
        load(args.ckpt, "cpu", **named)  # a checkpoint the workers cannot load fails here, with one line
    except ValueError as e:  # CheckpointError and friends
        if args.debug:
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    server = build_server(args, model)
    logging.getLogger("litserve.server").addFilter(QuietMonitorAtStop())
    # SIGTERM (and SIGINT, which a shell ignores in a background job) ends through LitServe's graceful shutdown.
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, stop)
    log.info("serving %s on http://%s:%d/ (GET / for the page, POST /predict)", ", ".join(args.ckpt), args.host,
             args.port)
    server.run(host=args.host, port=args.port, num_api_servers=1, generate_client_file=False, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
