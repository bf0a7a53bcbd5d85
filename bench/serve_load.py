"""serve.py under load: N requests at concurrency C, texts from a dataset's validation split.

    python -m bench.timing serve --ckpt lightning_logs/version_0                # starts serve.py, 2,000 × 32
    python -m bench.timing serve --url http://127.0.0.1:8000 --requests 500   # a server that is already running
    python -m bench.timing serve --ckpt ... --kill worker --kill-after 500     # SIGKILL the worker mid-load
    python -m bench.timing serve --ckpt ... --kill server --kill-after 500     # SIGKILL the server, start it again
                                                                              # (no request is sent until it is up)

Each client thread sends its requests one after another on one keep-alive connection (a new one after an error):
{"texts": [one validation text]} (--texts-per-request). Prints throughput, latency percentiles (p50/p95/p99), the
error count (an HTTP answer that is not 200, with its status and body), the lost requests (no HTTP answer at all:
refused, reset or timed out), and, with --ckpt, the ceiling: predict.py's batch throughput (TextClassifier.predict
over the same texts, batches of 256) in this process with the server's thread count. The machine's load average goes
into the figures, since the server, the clients and anything else running share the cores. The last line of
stdout is one JSON object with every figure.
"""

import http.client
import json
import logging
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

log = logging.getLogger("bench.serve_load")
ROOT = Path(__file__).resolve().parent.parent


THREADS = 1  # torch threads of the server's worker and of the ceiling measurement


def add_arguments(parser):
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--ckpt", help="start serve.py with this checkpoint (or run folder) on a free port")
    where.add_argument("--url", help="load a server that is already running, e.g. http://127.0.0.1:8000")
    parser.add_argument("--requests", type=int, default=2000, help="requests in all (default: 2000)")
    parser.add_argument("--concurrency", type=int, default=32, help="client threads (default: 32)")
    parser.add_argument("--texts-per-request", type=int, default=1, help="texts in each request (default: 1)")
    parser.add_argument("--dataset", default="sst2", help="registered dataset whose validation texts are sent "
                                                          "(default: sst2; its local copy under $ATTENTION_DATA_ROOT)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a client waits for an answer")
    parser.add_argument("--workers", type=int, default=1, help="serve.py --workers (default: 1)")
    parser.add_argument("--serve-args", default="", help="more serve.py arguments, e.g. '--max-batch-size 64'")
    parser.add_argument("--kill", choices=("worker", "server"),
                        help="with --ckpt: SIGKILL the inference worker (LitServe restarts it) or the whole server "
                             "(started again at once) after --kill-after answers")
    parser.add_argument("--kill-after", type=int, default=500, help="answers before --kill (default: 500)")


def validation_texts(dataset: str) -> list[str]:
    from data.sources import load_splits

    splits = load_splits(dataset=dataset, data_dir=None, train_file=None, val_file=None, test_file=None,
                         text_column=None, label_column=None, val_fraction=0.1, seed=0)
    return splits.texts["validation"]


# ---- the server -------------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """serve.py in its own process group, so that stopping it stops its workers too."""

    def __init__(self, ckpt: str, extra: list[str], log_path: Path):
        self.port, self.ckpt, self.extra, self.log_path = free_port(), ckpt, extra, log_path
        self.process = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, wait: float = 180.0) -> float:
        started = time.perf_counter()
        command = [sys.executable, str(ROOT / "serve.py"), "--ckpt", self.ckpt, "--port", str(self.port), *self.extra]
        self.process = subprocess.Popen(command, stdout=open(self.log_path, "ab"), stderr=subprocess.STDOUT,
                                        cwd=ROOT, start_new_session=True)
        while time.perf_counter() - started < wait:
            if self.process.poll() is not None:
                raise RuntimeError(f"serve.py exited with {self.process.returncode}; see {self.log_path}")
            if healthy(self.url):
                return time.perf_counter() - started
            time.sleep(0.2)
        raise RuntimeError(f"serve.py not healthy after {wait:.0f} s; see {self.log_path}")

    def worker_pids(self) -> list[int]:
        """The inference workers: processes of the server's group started by multiprocessing's spawn."""
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                if os.getpgid(int(entry.name)) != self.process.pid:
                    continue
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except (OSError, ProcessLookupError):
                continue
            if b"spawn_main" in command:
                pids.append(int(entry.name))
        return pids

    def kill(self):
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def stop(self):
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)  # LitServe's graceful shutdown stops its workers
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self.process.pid, signal.SIGKILL)  # whatever is left of the group
        except ProcessLookupError:
            pass
        self.process.wait()


def healthy(url: str) -> bool:
    try:
        connection = http.client.HTTPConnection(urlparse(url).hostname, urlparse(url).port, timeout=2)
        connection.request("GET", "/health")
        return connection.getresponse().status == 200
    except OSError:
        return False


# ---- the clients ------------------------------------------------------------------------------------------------


class Load:
    def __init__(self, url: str, bodies: list[bytes], concurrency: int, timeout: float):
        self.host, self.port = urlparse(url).hostname, urlparse(url).port
        self.bodies, self.concurrency, self.timeout = bodies, concurrency, timeout
        self.lock = threading.Lock()
        self.next = 0
        self.results = []  # (index, started, seconds, status or None, detail)
        self.answered = threading.Event()
        self.gate = threading.Event()  # cleared while a killed server starts again: no new request is sent
        self.gate.set()
        self.answers_for_event = None

    def take(self) -> int | None:
        with self.lock:
            if self.next >= len(self.bodies):
                return None
            self.next += 1
            return self.next - 1

    def client(self):
        connection = None
        while self.gate.wait() and (index := self.take()) is not None:
            if connection is None:
                connection = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            started = time.perf_counter()
            try:
                connection.request("POST", "/predict", body=self.bodies[index],
                                   headers={"Content-Type": "application/json"})
                response = connection.getresponse()
                body = response.read()
                status, detail = response.status, "" if response.status == 200 else body.decode(errors="replace")
                if status == 200 and len(json.loads(body)["predictions"]) != self.texts_per_request:
                    status, detail = -1, "wrong number of predictions"
            except (OSError, http.client.HTTPException) as e:
                status, detail = None, f"{type(e).__name__}: {e}"
                connection.close()
                connection = None
            seconds = time.perf_counter() - started
            with self.lock:
                self.results.append((index, started, seconds, status, detail))
                if self.answers_for_event is not None and len(self.results) >= self.answers_for_event:
                    self.answered.set()
        if connection is not None:
            connection.close()

    def run(self, texts_per_request: int) -> float:
        self.texts_per_request = texts_per_request
        threads = [threading.Thread(target=self.client, daemon=True) for _ in range(self.concurrency)]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return time.perf_counter() - started


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def ceiling(ckpt: str, texts: list[str], threads: int) -> float:
    """predict.py's batch throughput (texts/s): TextClassifier.predict over the texts, predict.py's batches."""
    import torch

    from inference import TextClassifier
    from inference.limits import PREDICT_BATCH

    torch.set_num_threads(threads)
    classifier = TextClassifier.from_checkpoint(ckpt, device="cpu")
    classifier.predict(texts[:PREDICT_BATCH])
    started = time.perf_counter()
    classifier.predict(texts)
    return len(texts) / (time.perf_counter() - started)


def run(args) -> tuple[str, dict]:
    from data.reading import has_text

    if args.kill and not args.ckpt:
        raise SystemExit("error: --kill needs --ckpt (the bench must have started the server to kill it)")
    texts = [text for text in validation_texts(args.dataset) if has_text(text)]
    k = args.texts_per_request
    bodies = [json.dumps({"texts": [texts[(i * k + j) % len(texts)] for j in range(k)]}).encode()
              for i in range(args.requests)]
    server = None
    figures = {"requests": args.requests, "concurrency": args.concurrency, "texts_per_request": k,
               "dataset": args.dataset}
    try:
        if args.ckpt:
            extra = ["--threads", str(args.threads), "--workers", str(args.workers), *args.serve_args.split()]
            server = Server(args.ckpt, extra, Path(os.environ.get("SERVE_LOG", "/tmp/serve_load.log")))
            figures["server_start_s"] = round(server.start(), 2)
            url = server.url
        else:
            url = args.url.rstrip("/")
        load = Load(url, bodies, args.concurrency, args.timeout)
        killer = None
        if args.kill:
            load.answers_for_event = args.kill_after
            killer = threading.Thread(target=kill_midway, args=(load, server, args.kill, figures), daemon=True)
            killer.start()
        wall = load.run(k)
        if killer is not None:
            killer.join()
        figures.update(summary(load.results, wall, k))
        if args.kill:
            figures.update(after_kill(load.results, figures["killed_at"]))
        if args.ckpt:
            figures["ceiling_texts_per_s"] = round(ceiling(args.ckpt, texts, args.threads), 1)
    finally:
        if server is not None:
            server.stop()
    figures["failed"] = bool(figures["errors"] or figures["lost"])  # the harness exits 1
    return report(figures), figures


def kill_midway(load: Load, server: Server, what: str, figures: dict):
    load.answered.wait()
    figures["killed_at"] = time.perf_counter()
    if what == "worker":
        pids = server.worker_pids()
        figures["killed"] = f"inference worker(s) {pids}"
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
    else:
        figures["killed"] = f"server (process group {server.process.pid})"
        load.gate.clear()  # the requests in flight fail; the rest wait for the new server (a client would retry)
        server.kill()
        figures["restart_s"] = round(server.start(), 2)  # same port: the clients reconnect to it
        load.gate.set()


def summary(results, wall: float, k: int) -> dict:
    ok = [seconds for _, _, seconds, status, _ in results if status == 200]
    first = min(started for _, started, _, _, _ in results)
    errors = [(status, detail) for _, _, _, status, detail in results if status not in (200, None)]
    lost = [detail for _, _, _, status, detail in results if status is None]
    seen = {}
    for status, detail in errors + [(None, detail) for detail in lost]:
        key = f"{status}: {detail[:160]}"
        seen[key] = seen.get(key, 0) + 1
    return {
        "answered": len(results), "ok": len(ok), "errors": len(errors), "lost": len(lost),
        "wall_s": round(wall, 2), "requests_per_s": round(len(ok) / wall, 1),
        "texts_per_s": round(len(ok) * k / wall, 1),
        "p50_ms": round(1000 * percentile(ok, 50), 1) if ok else None,
        "p95_ms": round(1000 * percentile(ok, 95), 1) if ok else None,
        "p99_ms": round(1000 * percentile(ok, 99), 1) if ok else None,
        "max_ms": round(1000 * max(ok), 1) if ok else None,
        # the five slowest: when each started (seconds after the first request) and how long it took
        "slowest": [[round(started - first, 2), round(seconds, 3)]
                    for _, started, seconds, _, _ in sorted(results, key=lambda r: -r[2])[:5]],
        "failures_seen": seen,
    }


def after_kill(results, killed_at: float) -> dict:
    """How requests fared around the kill: those in flight at the kill, and those sent after it."""
    in_flight = [status for _, started, seconds, status, _ in results if started < killed_at < started + seconds]
    after = [(seconds, status) for _, started, seconds, status, _ in results if started >= killed_at]
    return {"in_flight_at_kill": len(in_flight), "in_flight_failed": sum(status != 200 for status in in_flight),
            "sent_after_kill": len(after), "failed_after_kill": sum(status != 200 for _, status in after),
            "longest_wait_after_kill_s": round(max((seconds for seconds, _ in after), default=0.0), 2)}


def report(figures: dict) -> str:
    lines = [f"{figures['answered']} requests ({figures['texts_per_request']} text each) at concurrency "
             f"{figures['concurrency']}: {figures['requests_per_s']} requests/s, {figures['texts_per_s']} texts/s",
             f"latency p50 {figures['p50_ms']} ms, p95 {figures['p95_ms']} ms, p99 {figures['p99_ms']} ms, "
             f"max {figures['max_ms']} ms",
             f"errors {figures['errors']}, lost {figures['lost']}"]
    for failure, count in figures["failures_seen"].items():
        lines.append(f"  {count} × {failure}")
    if "ceiling_texts_per_s" in figures:
        lines.append(f"ceiling (predict.py batch throughput, same threads): {figures['ceiling_texts_per_s']} texts/s")
    if "killed" in figures:
        lines.append(f"killed {figures['killed']}: {figures['in_flight_failed']} of {figures['in_flight_at_kill']} "
                     f"requests in flight failed; {figures['failed_after_kill']} of {figures['sent_after_kill']} sent "
                     f"after it failed, the longest waited {figures['longest_wait_after_kill_s']} s")
    figures.pop("killed_at", None)
    return "\n".join(lines)
