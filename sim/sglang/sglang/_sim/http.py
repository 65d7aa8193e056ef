"""SGLang's HTTP API (python/sglang/srt/entrypoints/http_server.py), served with the standard library."""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import random
import socket
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from . import chat as C
from . import gpu as G
from . import release as R
from . import throughput as T
from .clock import WALL_PER_SIM, Clock
from .logs import emit, line
from .metrics import Metrics
from .scheduler import Scheduler, hang_while_nccl_hangs

WORDS = ["the", "model", "answers", "with", "simulated", "tokens", "from", "the", "lab", "while", "the", "real",
         "hardware", "is", "elsewhere", "and", "every", "number", "reported", "here", "follows", "the",
         "documented", "throughput", "model", "of", "the", "simulator"]
# Wall seconds between two streamed chunks of one request, per request running. SGLang streams every token
# (--stream-interval 1); at the lab's time scales a token lasts microseconds of wall time, so the simulator sends
# the tokens decoded since the last chunk at most this often, and less often the more requests run, so that the
# whole server sends about 500 chunks a second (bench_serving spreads a chunk's gap over its tokens, and the
# simulated decode speed is smooth, so TPOT and ITL stay right).
STREAM_WALL_INTERVAL = 0.002
# Decoding runs at SGLANG_SIM_TIME_SCALE (1.0 without it); SGLANG_SIM_SERVE_TIME_SCALE, when set, runs
# requests at a scale of their own, so a benchmark can be timed precisely (a millisecond of HTTP overhead is
# 0.06 simulated seconds at 1.0 but 1.2 at 0.05) while start-up stays fast.
SERVE_TIME_SCALE_ENV = "SGLANG_SIM_SERVE_TIME_SCALE"
# Response header naming the time scale requests decode at, so the simulated bench_serving reports simulated
# seconds on the server's scale whatever its own environment says (real clients ignore it).
TIME_SCALE_HEADER = "x-sglang-sim-time-scale"
# http_server.HEALTH_CHECK_TIMEOUT: /health's one-token request may take this long before it answers 503
HEALTH_CHECK_TIMEOUT = int(os.getenv("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
# environ.py SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION (EnvBool, default true): off, /health (not /health_generate)
# answers 200 without asking the scheduler
HEALTH_GENERATION_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"


def health_generation_enabled() -> bool:
    return os.environ.get(HEALTH_GENERATION_ENV, "true").strip().lower() not in ("false", "0", "no", "n")


class State:
    def __init__(self, args, plan, cfg, clock, prefix_tp0: str, slowdown: float = 1.0):
        self.args = args
        self.plan = plan
        self.cfg = cfg
        self.clock = clock
        self.serve_clock = serve_clock()
        self.prefix_tp0 = prefix_tp0
        self.ready = False
        self.lock = threading.Lock()
        self.running = 0
        self.prompt_tokens_total = 0
        self.generation_tokens_total = 0
        self.requests_total = 0
        self.last_gen_throughput = 0.0
        # DP ranks (dp_size of them, with or without DP attention) take requests in turn (the DP controller's
        # round_robin); running requests per DP rank
        self.dp_running = [0] * max(1, int(args.dp_size or 1))
        self.dp_next = 0
        # --enable-metrics: what /metrics reports (metrics.py); set by the server once its ranks run
        self.metrics: Metrics | None = None
        # fault "slow" (faults.py): every prefill and decode step takes `slowdown` times as long
        self.slowdown = slowdown
        s1, self.healthy_agg = T.layout_rates(args.tp_size, args.pp_size, args.ep_size, args.dp_size,
                                              args.enable_dp_attention)
        self.s1, self.agg = s1 / slowdown, self.healthy_agg / slowdown
        self.created = int(time.time())
        # fault oom_runtime: requests answered before the next one runs out of memory in the forward pass, and
        # what makes the scheduler rank fail (set by the server); None: no runtime OOM
        self.runtime_oom_after: int | None = None
        self.runtime_oom = None
        # faults garbage and parser_missing (faults.py): what chat answers carry (chat.py)
        self.garbage = False
        self.parsers_apply = True
        # Set on SIGTERM (server.py): like TokenizerManager's graceful exit, /health answers 503 while the
        # requests finish; new requests are still taken (SGLang 0.5.10 refuses none: only its health turns).
        self.draining = False
        # When the server became ready (time.monotonic()): TokenizerManager's SIGTERM watchdog, started with the
        # first request, looks every 5 s from about then.
        self.ready_since = 0.0
        # When a batch last produced output (TokenizerManager.last_receive_tstamp, which /health's message reports)
        self.last_output = time.time()  # TokenizerManager.__init__: real_time()
        # TP0's event loop: serial chunked prefill, decode log lines, health checks (scheduler.py)
        self.scheduler = Scheduler(self)


def serve_clock() -> Clock:
    """The clock requests decode on: SGLANG_SIM_SERVE_TIME_SCALE when set, else SGLANG_SIM_TIME_SCALE when set, else
    1.0. A lab host's own scale (/etc/sim-gpu/time-scale) speeds its start-ups only: served at that scale, a
    millisecond of HTTP overhead would weigh as much as a model step in the bench's figures."""
    clock = Clock()
    for name in (SERVE_TIME_SCALE_ENV, "SGLANG_SIM_TIME_SCALE"):
        with contextlib.suppress(KeyError, ValueError):
            clock.factor = WALL_PER_SIM * float(os.environ[name])
            return clock
    clock.factor = WALL_PER_SIM
    return clock


def count_tokens(text: str) -> int:
    return max(1, (len(text) + 3) // 4)


def completion_words(seed: str, max_tokens: int | None, ignore_eos: bool = False,
                     thought: int = 0) -> tuple[list[str], str]:
    """The completion's words (one token each) and finish reason: a thought of ``thought`` tokens, then an answer of
    12-40; both share max_tokens; ignore_eos decodes all max_tokens."""
    h = int(hashlib.sha256(seed.encode()).hexdigest(), 16)
    natural = thought + 12 + h % 29
    if ignore_eos and max_tokens is not None:
        natural = max_tokens + 1
    n = natural if max_tokens is None else min(natural, max_tokens)
    pick = random.Random(h)  # one seeded generator: a 512-token completion costs microseconds, not milliseconds
    words = [WORDS[pick.randrange(len(WORDS))] for _ in range(n)]
    return words, ("length" if max_tokens is not None and natural > max_tokens else "stop")


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "uvicorn"
    disable_nagle_algorithm = True  # TCP_NODELAY, as asyncio (uvicorn) sets it: no streamed chunk waits for an ACK
    sys_version = ""
    state: State = None  # set by make_server

    def log_message(self, fmt, *args):  # uvicorn access log format
        pass

    def _access(self, code: int) -> None:
        phrase = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
                  503: "Service Unavailable", 405: "Method Not Allowed"}.get(code, "")
        host, port = self.client_address[:2]
        emit(f'INFO:     {host}:{port} - "{self.command} {self.path} HTTP/1.1" {code} {phrase}')
        tracked, self._tracked = getattr(self, "_tracked", None), None
        if tracked is not None:
            self.state.metrics.http_end(*tracked, code)

    def _track(self, path: str) -> None:
        """The metrics middleware (utils/common.py add_prometheus_track_response_middleware) sees the request: it
        runs inside the API-key middleware, so only once the request is let in. Its endpoint is the route's path;
        the /metrics mount matches every path that starts so."""
        if self.state.metrics is not None:
            endpoint = "/metrics" if self._metrics_path(path) else path
            self._tracked = (endpoint, self.command)
            self.state.metrics.http_begin(endpoint, self.command)

    def send_response(self, code, message=None):
        self._status = code
        super().send_response(code, message)

    def _untrack(self) -> None:
        """The middleware's `finally`: a request that ended without its access line (the client went away in the
        middle of a stream) still leaves the active ones, answered with the status it was sent."""
        tracked, self._tracked = getattr(self, "_tracked", None), None
        if tracked is not None:
            self.state.metrics.http_end(*tracked, getattr(self, "_status", None) or 500)

    def _metrics_path(self, path: str) -> bool:
        """add_prometheus_middleware mounts /metrics with the path regex ^/metrics(?P<path>.*)$ (any method)."""
        return self.state.metrics is not None and path.startswith("/metrics")

    def _serve_metrics(self) -> None:
        body, headers = self.state.metrics.render(self.headers.get("Accept"), self.headers.get("Accept-Encoding"))
        ctype = headers.pop("content-type")
        self._send(200, body, ctype, headers)

    def _send(self, code: int, body, ctype: str = "application/json", headers: dict | None = None) -> None:
        data = body if isinstance(body, bytes) else (json.dumps(body) if not isinstance(body, str) else body).encode()
        self.send_response(code)
        self.send_header("content-type", ctype)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("content-length", str(len(data)))
        self.send_header(TIME_SCALE_HEADER, repr(self.state.serve_clock.factor / WALL_PER_SIM))
        self.end_headers()
        self.wfile.write(data)
        self._access(code)

    def _body(self) -> dict:
        n = int(self.headers.get("content-length") or 0)
        raw = self.rfile.read(n) if n else b""
        try:
            return json.loads(raw or b"{}")
        except ValueError:
            return {}

    def _authorized(self) -> bool:
        key = self.state.args.api_key
        if not key or self.command == "OPTIONS":
            return True
        path = self.path.split("?")[0]
        if path.startswith("/health") or path.startswith("/metrics"):
            return True
        if self.headers.get("Authorization") != "Bearer " + key:
            self._send(401, {"error": "Unauthorized"})
            return False
        return True

    # ----------------------------------------------------------------------------------------
    def do_GET(self):  # noqa: N802
        self._tracked = self._status = None
        try:
            self._get()
        finally:
            self._untrack()

    def _get(self):
        if not self._authorized():
            return
        path = self.path.split("?")[0]
        st = self.state
        self._track(path)
        if self._metrics_path(path):
            self._serve_metrics()
            return
        if path in ("/health", "/health_generate"):
            self._health(path)
        elif path in ("/server_info", "/get_server_info"):
            if path == "/get_server_info":  # http_server.get_server_info, in both releases
                line(st.clock, "", "Endpoint '/get_server_info' is deprecated and will be removed in a future "
                     "version. Please use '/server_info' instead.")
            self._send(200, server_info(st))
        elif path in ("/model_info", "/get_model_info"):
            self._send(200, {
                "model_path": st.args.model_path, "tokenizer_path": st.args.tokenizer_path,
                "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
                "has_image_understanding": st.cfg.is_multimodal, "has_audio_understanding": False,
                "model_type": st.cfg.raw.get("model_type"), "architectures": st.cfg.raw.get("architectures"),
            })
        elif path == "/v1/models":
            self._send(200, {"object": "list", "data": [{
                "id": st.args.served_model_name, "object": "model", "created": st.created, "owned_by": "sglang",
                "root": st.args.served_model_name, "parent": None, "max_model_len": st.plan.context_len}]})
        elif path == "/get_load" and st.args.release == "0.5.10":  # 0.5.23 has no /get_load
            # http_server.get_load: a warning at each call, then the tokenizer manager's per-rank list
            line(st.clock, "", "Endpoint '/get_load' is deprecated and will be removed in a future version. "
                 "Please use '/v1/loads' instead.")
            self._send(200, [{"num_reqs": st.running, "num_waiting_reqs": 0, "num_tokens": 0}])
        elif path == "/v1/loads":
            include = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query).get("include")
            try:
                self._send(200, loads(st, include[0] if include else None))
            except ValueError as exc:  # FastAPI's HTTPException(400, detail=...)
                self._send(400, {"detail": str(exc)})
        else:
            self._send(404, {"detail": "Not Found"})

    def _health(self, path: str) -> None:
        """http_server.health_generate: 503 while shutting down or starting; with
        SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION off, /health is a plain 200; else a one-token request goes to the
        scheduler and the check looks once a second whether the tokenizer received anything since it began: 200
        then, 503 after HEALTH_CHECK_TIMEOUT."""
        st = self.state
        if st.draining:
            line(st.clock, "", "Health check request received during shutdown. Returning 503.")
            self._send(503, b"", "text/plain")
            return
        if not st.ready:
            self._send(503, b"", "text/plain")
            return
        if path == "/health" and not health_generation_enabled():
            self._send(200, b"", "text/plain")
            return
        st.scheduler.health_check()
        tic = time.time()
        while time.time() < tic + HEALTH_CHECK_TIMEOUT:
            time.sleep(1)
            if st.last_output > tic:
                self._send(200, b"", "text/plain")
                return
        line(st.clock, "", "Health check failed. Server couldn't get a response from detokenizer for last "
             f"{HEALTH_CHECK_TIMEOUT} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
             f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(st.last_output))}")
        self._send(503, b"", "text/plain")

    def do_POST(self):  # noqa: N802
        self._tracked = self._status = None
        try:
            self._post()
        finally:
            self._untrack()

    def _post(self):
        if not self._authorized():
            return
        path = self.path.split("?")[0]
        body = self._body()
        self._track(path)
        if self._metrics_path(path):
            self._serve_metrics()
            return
        if not self.state.ready and path in ("/generate", "/v1/chat/completions", "/v1/completions"):
            pass  # SGLang queues requests that arrive during warm-up; answer after the fact
        if path == "/generate":
            self._generate(body)
        elif path == "/v1/chat/completions":
            self._chat(body)
        elif path == "/v1/completions":
            self._completion(body)
        elif path in ("/flush_cache",):
            self._send(200, b"Cache flushed.\nPlease check backend logs for more details. (When there are "
                            b"running or waiting requests, the operation will not be performed.)\n", "text/plain")
        else:
            self._send(404, {"detail": "Not Found"})

    # ----------------------------------------------------------------------------------------
    def _run(self, prompt: str, max_tokens: int | None, stream_cb=None, ignore_eos: bool = False,
             prompt_tokens: int | None = None, thought: int = 0):
        """Prefill (prompt_tokens, else the prompt's count), then decode following the throughput model at the
        speed the requests running now share, sleeping the scaled simulated time to absolute deadlines (a late
        wake-up is not carried forward).
        stream_cb(done, new_words) is called once the first token is out and then about every
        STREAM_WALL_INTERVAL x (requests running) of wall time.
        Returns (words, finish, prompt tokens, e2e sim seconds, speed)."""
        st = self.state
        words, finish = completion_words(prompt, max_tokens, ignore_eos, thought)
        ptoks = count_tokens(prompt) if prompt_tokens is None else max(1, prompt_tokens)
        with st.lock:
            st.running += 1
            b = st.running
            st.requests_total += 1
            oom = st.runtime_oom_after is not None and st.requests_total > st.runtime_oom_after
            dp = st.dp_next
            st.dp_next = (dp + 1) % len(st.dp_running)
            st.dp_running[dp] += 1
        if oom:  # the scheduler's forward pass fails; the server dies the SIGQUIT way, this request with it
            st.runtime_oom()
            while True:
                time.sleep(3600)
        clock = st.serve_clock
        speed = T.per_request(b, st.s1, st.agg)
        start = clock.sim_now()
        metrics = st.metrics
        req = metrics.begin(dp, ptoks, start, stream_cb is not None) if metrics else None
        finished = decoding = False
        sched = st.scheduler
        try:
            sched.prefill(ptoks)  # waits its turn in TP0's loop; chunked as SGLang does; then it decodes
            decoding = True
            step = clock.sim_now()
            t = step + 1.0 / speed
            _sleep_to(clock, t)
            done = min(1, len(words))
            sched.decoded(done)
            if req and done:
                metrics.decoded(req, done, t, step, 0, len(words))
            if stream_cb and done:
                stream_cb(done, words[:done])
            while done < len(words):
                hang_while_nccl_hangs()
                if sched.wait_for_decode_turn():  # a prefill batch ran meanwhile: decoding resumes after it
                    t = max(t, clock.sim_now())
                st.last_output = time.time()
                running = st.running
                speed = T.per_request(running, st.s1, st.agg)
                left = len(words) - done
                k = min(left, max(1, int(STREAM_WALL_INTERVAL * running / clock.factor * speed))) \
                    if clock.factor > 0 else left
                step = t
                t += k / speed
                _sleep_to(clock, t)
                done += k
                sched.decoded(k)
                if req:
                    metrics.decoded(req, done, t, step, done - k, len(words))
                if stream_cb:
                    stream_cb(done, words[done - k:done])
            finished = True
        finally:
            sched.release(ptoks + len(words), decoding)
            with st.lock:
                st.running -= 1
                st.dp_running[dp] -= 1
                st.prompt_tokens_total += ptoks
                st.generation_tokens_total += len(words)
                st.last_gen_throughput = T.aggregate(b, st.s1, st.agg)
            if req and finished:
                metrics.finish(req, len(words), t)
            elif req:  # the client went away
                metrics.abort(req)
        return words, finish, ptoks, t - start, speed

    def _sse_start(self):
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.send_header(TIME_SCALE_HEADER, repr(self.state.serve_clock.factor / WALL_PER_SIM))
        self.end_headers()

    def _chunk(self, data: str) -> None:
        raw = data.encode()
        self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        self.wfile.flush()

    def _sse_end(self):
        self._chunk("data: [DONE]\n\n")
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self._access(200)

    def _generate(self, body: dict):
        text = body.get("text") or ""
        if isinstance(text, list):
            text = text[0] if text else ""
        # input_ids instead of text (bench_serving --tokenize-prompt): the prompt is that many tokens
        ids = body.get("input_ids") if not text else None
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            ids = ids[0]
        given = len(ids) if isinstance(ids, list) else None
        if given is not None:
            text = " ".join(map(str, ids))
        sp = body.get("sampling_params") or {}
        max_new = sp.get("max_new_tokens", 128)
        ignore_eos = bool(sp.get("ignore_eos"))
        rid = uuid.uuid4().hex
        if self._refuse_length(given or count_tokens(text), openai=False):
            return
        if body.get("stream"):
            self._sse_start()
            acc = []

            def cb(done, new_words):
                acc.extend(new_words)
                self._chunk("data: " + json.dumps({"text": " ".join(acc), "meta_info": {
                    "id": rid, "finish_reason": None, "prompt_tokens": given or count_tokens(text),
                    "completion_tokens": done}}) + "\n\n")
            words, finish, ptoks, e2e, _ = self._run(text, max_new, cb, ignore_eos, given)
            self._chunk("data: " + json.dumps({"text": " ".join(words), "meta_info": self._meta(
                rid, finish, ptoks, len(words), e2e, max_new)}) + "\n\n")
            self._sse_end()
            return
        words, finish, ptoks, e2e, _ = self._run(text, max_new, ignore_eos=ignore_eos, prompt_tokens=given)
        self._send(200, {"text": " ".join(words), "output_ids": list(range(len(words))),
                         "meta_info": self._meta(rid, finish, ptoks, len(words), e2e, max_new)})

    def _refuse_length(self, ptoks: int, openai: bool) -> bool:
        """A prompt longer than the server can hold is refused (400) before it is scheduled: the tokenizer's check
        against the context length (TokenizerManager._validate_one_request), then the scheduler's against
        max_req_input_len = min(context_len - 1, KV pool tokens - 1) - 5 (tp_worker.py, validate_input_length)."""
        plan = self.state.plan
        ctx = int(plan.context_len)
        limit = min(ctx - 1, int(plan.max_total_num_tokens) - 1) - 5
        if ptoks >= ctx:
            msg = f"The input ({ptoks} tokens) is longer than the model's context length ({ctx} tokens)."
        elif ptoks >= limit:
            msg = (f"Input length ({ptoks} tokens) exceeds the maximum allowed length ({limit} tokens). "
                   "Use a shorter input or enable --allow-auto-truncate.")
        else:
            return False
        body = {"object": "error", "message": msg, "type": "BadRequestError", "param": None, "code": 400} \
            if openai else {"error": {"message": msg}}
        self._send(400, body)
        return True

    @staticmethod
    def _meta(rid, finish, ptoks, ctoks, e2e, max_new):
        fr = {"type": "length", "length": max_new} if finish == "length" else {"type": "stop", "matched": 163586}
        return {"id": rid, "finish_reason": fr, "prompt_tokens": ptoks, "weight_version": "default",
                "completion_tokens": ctoks, "cached_tokens": 0, "e2e_latency": round(e2e, 4)}

    def _chat(self, body: dict):
        st = self.state
        msgs = body.get("messages") or []
        if not msgs:
            self._send(400, {"object": "error", "message": "messages must not be empty", "type": "BadRequestError",
                             "param": None, "code": 400})
            return
        prompt = "\n".join(_content_text(m.get("content")) for m in msgs)
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        ignore_eos = bool(body.get("ignore_eos"))  # SGLang's extra sampling parameter, as in /generate
        cid = uuid.uuid4().hex
        created = int(time.time())
        model = body.get("model") or st.args.served_model_name
        if self._refuse_length(count_tokens(prompt), openai=True):
            return
        family = C.family(st.cfg.architecture)
        thought = C.thought_tokens(body, prompt) if C.thinks(body, family) and not st.garbage else 0
        if body.get("stream"):
            self._sse_start()
            self._chunk("data: " + json.dumps(_chat_chunk(cid, created, model, {"role": "assistant",
                                                                                 "content": ""}, None)) + "\n\n")
            # with --reasoning-parser kimi_k2 the thought streams as reasoning_content, the rest as content
            split = thought if st.parsers_apply and st.args.reasoning_parser == "kimi_k2" \
                and body.get("separate_reasoning", True) else 0

            def cb(done, new_words):
                first = done - len(new_words)
                for key, lo, hi in (("reasoning_content", first, min(done, split)),
                                    ("content", max(first, split), done)):
                    if hi > lo:
                        lead = "" if lo in (0, split) else " "
                        piece = lead + " ".join(new_words[lo - first:hi - first])
                        self._chunk("data: " + json.dumps(_chat_chunk(cid, created, model, {key: piece}, None))
                                    + "\n\n")
            words, finish, ptoks, _, _ = self._run(prompt, max_tokens, cb, ignore_eos, thought=thought)
            last = _chat_chunk(cid, created, model, {}, finish)
            opts = body.get("stream_options") or {}
            if opts.get("include_usage"):
                self._chunk("data: " + json.dumps(last) + "\n\n")
                last = _chat_chunk(cid, created, model, None, None)
                last["choices"] = []
                last["usage"] = _usage(ptoks, len(words))
            self._chunk("data: " + json.dumps(last) + "\n\n")
            self._sse_end()
            return
        words, finish, ptoks, _, _ = self._run(prompt, max_tokens, ignore_eos=ignore_eos, thought=thought)
        # the model's own tokens (chat.py: Kimi K2.x, else DeepSeek-V3-style), through the server's parsers
        text, finish = C.raw(body, words, finish, _content_text, garbage=st.garbage, model=family, thought=thought)
        parsers = (st.args.reasoning_parser, st.args.tool_call_parser) if st.parsers_apply else (None, None)
        message, finish = C.message(text, body, finish, *parsers)
        self._send(200, {
            "id": cid, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message,
                         "logprobs": None, "finish_reason": finish, "matched_stop": 163586 if finish == "stop"
                         else None}],
            "usage": _usage(ptoks, len(words)),
            "metadata": {"weight_version": "default"},
        })

    def _completion(self, body: dict):
        st = self.state
        prompt = body.get("prompt") or ""
        if isinstance(prompt, list):
            prompt = prompt[0] if prompt else ""
        max_tokens = body.get("max_tokens", 16)
        if self._refuse_length(count_tokens(str(prompt)), openai=True):
            return
        words, finish, ptoks, _, _ = self._run(str(prompt), max_tokens)
        self._send(200, {
            "id": uuid.uuid4().hex, "object": "text_completion", "created": int(time.time()),
            "model": body.get("model") or st.args.served_model_name,
            "choices": [{"index": 0, "text": " ".join(words), "logprobs": None, "finish_reason": finish}],
            "usage": _usage(ptoks, len(words)),
        })


def _sleep_to(clock, sim_t: float) -> None:
    """Sleep until simulated time sim_t (the shared clock's logical time, used by log lines, is left alone)."""
    delay = (sim_t - clock.sim_now()) * clock.factor
    if delay > 0:
        time.sleep(delay)


def _content_text(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def _usage(p: int, c: int) -> dict:
    return {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c, "prompt_tokens_details": None}


def _chat_chunk(cid, created, model, delta, finish):
    return {"id": cid, "object": "chat.completion.chunk", "created": created, "model": model,
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


# 0.5.23 LoadSnapshot.VALID_SECTIONS: what ?include= may name, and the section each fills
LOAD_SECTIONS = {"core": None, "memory": "memory", "spec": "speculative", "lora": "lora", "disagg": "disaggregation",
                 "queues": "queues", "all": None}


def loads(st: State, include: str | None = None) -> dict:
    """GET /v1/loads (entrypoints/v1_loads.py of the release): one entry per DP rank (requests go to them in turn).
    0.5.10 adds their aggregate; 0.5.23 has none, names the accelerator and how many serve one DP rank, and gives
    each rank's LoadSnapshot (managers/load_snapshot.py: the core fields, then the memory, disaggregation and queues
    sections that scheduler_components/load_inquirer.py fills; speculative and LoRA ones only when in use), those
    ``include`` names (comma-separated) when given: ValueError with SGLang's sentence for a section it does not know.
    0.5.10's answer is the same whatever ``include`` says."""
    args, plan = st.args, st.plan
    ranks = max(1, int(args.dp_size or 1)) if args.enable_dp_attention else 1
    running = [st.dp_running[rank] if ranks > 1 else st.running for rank in range(ranks)]
    if args.release == "0.5.10":
        entries = [{
            "dp_rank": rank, "num_running_reqs": running[rank], "num_waiting_reqs": 0, "num_used_tokens": 0,
            "max_total_num_tokens": plan.max_total_num_tokens, "token_usage": 0.0, "gen_throughput": 0.0,
            "cache_hit_rate": 0.0, "utilization": 0.0, "max_running_requests": plan.max_running_requests,
            "num_total_reqs": running[rank],
        } for rank in range(ranks)]
        return {
            "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime()), "version": R.current(),
            "dp_rank_count": len(entries), "loads": entries,
            "aggregate": {
                "total_running_reqs": sum(e["num_running_reqs"] for e in entries),
                "total_waiting_reqs": sum(e["num_waiting_reqs"] for e in entries),
                "total_reqs": sum(e["num_total_reqs"] for e in entries),
                "avg_token_usage": 0.0, "avg_throughput": 0.0, "avg_utilization": 0.0,
            },
        }
    memory = _memory_usage(plan)
    entries = [{
        "timestamp": time.time(), "dp_rank": rank, "num_running_reqs": running[rank], "num_waiting_reqs": 0,
        "num_waiting_uncached_tokens": 0, "num_used_tokens": 0, "num_total_tokens": 0, "num_active_tokens": 0,
        "num_prealloc_ready_tokens": 0, "max_total_num_tokens": plan.max_total_num_tokens,
        "max_running_requests": plan.max_running_requests, "token_usage": 0.0, "gen_throughput": 0.0,
        "cache_hit_rate": 0.0, "utilization": 0.0, "total_prefill_uncached_tokens": 0, "total_prefill_busy_us": 0,
        "decode_moments": None,
        "memory": {"weight_gb": round(memory["weight"], 3), "kv_cache_gb": round(memory["kvcache"], 3),
                   "graph_gb": round(memory["graph"], 3), "token_capacity": plan.max_total_num_tokens},
        "disaggregation": {"mode": "null", "prefill_bootstrap_queue_reqs": 0, "prefill_inflight_queue_reqs": 0,
                           "decode_prealloc_queue_reqs": 0, "decode_transfer_queue_reqs": 0,
                           "decode_retracted_queue_reqs": 0, "kv_transfer_speed_gb_s": 0.0,
                           "kv_transfer_latency_ms": 0.0},
        "queues": {"waiting": 0, "grammar": 0, "paused": 0, "retracted": 0, "prealloc_ready": 0},
    } for rank in range(ranks)]
    if include is not None:
        asked = {part.strip() for part in include.split(",")}
        if not asked <= set(LOAD_SECTIONS):
            raise ValueError(f"Invalid include sections: {asked - set(LOAD_SECTIONS)}. "
                             f"Valid options: {sorted(LOAD_SECTIONS)}")
        if "all" not in asked:
            dropped = {LOAD_SECTIONS[name] for name in LOAD_SECTIONS if name not in asked} - {None}
            entries = [{k: v for k, v in entry.items() if k not in dropped} for entry in entries]
    return {
        # datetime.UTC is Python 3.11's; the simulator declares 3.10
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),  # noqa: UP017
        "version": R.current(),
        "accelerator": G.load_spec()["name"], "num_accelerators": args.tp_size * args.pp_size // ranks,
        "loads": entries,
    }


def _memory_usage(plan) -> dict:
    """GiB per rank as the scheduler reports them (the largest rank's): weights, KV pool, CUDA graphs."""
    return {"weight": max(rp.weights_gib_reported for rp in plan.ranks),
            "kvcache": max(rp.kv_bytes for rp in plan.ranks) / (1 << 30),
            "graph": max(rp.graph_bytes for rp in plan.ranks) / (1 << 30)}


def server_info(st: State) -> dict:
    """GET /server_info: the server's arguments (0.5.10: dataclasses.asdict; 0.5.23: its resolved record, with
    attn_dp_size, the per-phase CUDA graph flags as given and cuda_graph_config), the scheduler's figures,
    internal_states and the version."""
    from .args import server_info_fields
    args, plan = st.args, st.plan
    info = {k: getattr(args, k, None) for k in server_info_fields(args.release)}
    info.update(args.reported)
    if args.release != "0.5.10":
        info["cuda_graph_config"] = args.graphs
    info["max_running_requests"] = plan.max_running_requests
    info["context_length"] = plan.context_len
    info["max_total_num_tokens"] = plan.max_total_num_tokens
    memory = _memory_usage(plan)
    info["internal_states"] = [{
        "max_total_num_tokens": plan.max_total_num_tokens, "max_running_requests": plan.max_running_requests,
        "cuda_graph_max_bs": plan.cuda_graph_max_bs, "last_gen_throughput": round(st.last_gen_throughput, 2),
        "memory_usage": {
            "weight": round(memory["weight"], 2), "kvcache": round(memory["kvcache"], 2),
            "graph": round(memory["graph"], 2), "token_capacity": plan.max_total_num_tokens,
        },
    }]
    info["version"] = R.current()
    if args.release != "0.5.10":
        info["startup_time"] = st.created
        info["frontend"] = "python"
    return info


def make_server(host: str, port: int, state: State) -> ThreadingHTTPServer:
    handler = type("SimHandler", (Handler,), {"state": state})
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.request_queue_size = 2048  # uvicorn's --backlog: a benchmark connects hundreds at once
    # uvicorn binds an IPv6 address (":" in --host, e.g. "::" or "::1") with an AF_INET6 socket
    cls = type("SimServer6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6}) if ":" in host \
        else ThreadingHTTPServer
    srv = cls((host, port), handler)
    srv.daemon_threads = True
    return srv
