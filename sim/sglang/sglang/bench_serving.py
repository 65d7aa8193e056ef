"""`python -m sglang.bench_serving` of the simulator: SGLang 0.5.10's benchmark client against the simulated server.

The command line (every flag, type, default and choice), the order of what it prints, the result block and the
--output-file JSON line follow python/sglang/bench_serving.py of the sglang 0.5.10 wheel (run_benchmark(),
benchmark(), calculate_metrics(), the argparse block under ``__main__``); the label strings and JSON keys are
copied from there as data. Written for the lab with the standard library only (no aiohttp, numpy, requests,
tokenizers or tqdm), so:

- the backends ``sglang`` and ``sglang-native`` are driven (/generate, streamed, ``ignore_eos`` unless
  --disable-ignore-eos, as the real sglang backend does); the others are refused with a sentence;
- the datasets ``random`` and ``random-ids`` are generated (lengths drawn as compute_random_lens() does;
  prompts of words that the simulator counts as one token each, or token ids with --tokenize-prompt, sent as
  ``input_ids``); the others are refused. ``random`` samples ShareGPT as the real one does: a --dataset-path
  that holds valid JSON, else the file in the Hugging Face cache, else the download from the Hub, which the
  simulator never attempts: it fails as the real client does on a host without internet (huggingface_hub's
  LocalEntryNotFoundError, its last line word for word);
- times are simulated seconds: wall time divided by the server's time factor (``SGLANG_SIM_TIME_SCALE``,
  which the server names in a response header, otherwise this process's own), so durations, TTFT, ITL and
  tok/s read as they would on the hardware the simulator stands in for;
- "retokenized" counts are the words of the generated text (the simulator's tokenizer: one word, one token).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import ipaddress
import json
import math
import os
import random
import sys
import time
import traceback
import urllib.parse
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime

from sglang._sim.clock import WALL_PER_SIM, time_scale

TIME_SCALE_HEADER = "x-sglang-sim-time-scale"  # sglang/_sim/http.py
DRIVEN_BACKENDS = ("sglang", "sglang-native")
GENERATED_DATASETS = ("random", "random-ids")
# bench_serving.ASYNC_REQUEST_FUNCS' keys: the --backend choices
BACKENDS = ("sglang", "sglang-native", "sglang-oai", "sglang-oai-chat", "sglang-embedding", "vllm", "vllm-chat",
            "lmdeploy", "lmdeploy-chat", "trt", "gserver", "truss")
DEFAULT_PORTS = {"sglang": 30000, "sglang-native": 30000, "sglang-oai": 30000, "lmdeploy": 23333, "vllm": 8000,
                 "trt": 8000, "gserver": 9988, "truss": 8080}
# sglang/benchmark/datasets/common.py: where --dataset-name random samples its text
SHAREGPT_REPO_ID = "anon8231489123/ShareGPT_Vicuna_unfiltered"
SHAREGPT_FILENAME = "ShareGPT_V3_unfiltered_cleaned_split.json"
HF_ENDPOINT = "https://huggingface.co"
# Kimi K2.6's vocab_size (sim/model/kimi_k26_config.json): random-ids draws token ids below it
VOCAB_SIZE = 163840
PROMPT_WORDS = ("the", "and", "for", "are", "but", "not", "you", "all", "any", "can", "had", "her", "was", "one",
                "our", "out", "day", "get", "has", "him", "his", "how", "man", "new", "now", "old", "see", "two")


class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, list(values))


def build_parser() -> argparse.ArgumentParser:
    """The 0.5.10 parser: same flags, order (so the printed Namespace matches), types, defaults and choices."""
    p = argparse.ArgumentParser(description="Benchmark the online serving throughput.")
    a = p.add_argument
    a("--backend", type=str, choices=list(BACKENDS), default="sglang")
    a("--base-url", type=str, default=None)
    a("--host", type=str, default="0.0.0.0")
    a("--port", type=int)
    a("--ready-check-timeout-sec", type=int, default=60)
    a("--dataset-name", type=str, default="sharegpt",
      choices=["sharegpt", "custom", "openai", "random", "random-ids", "generated-shared-prefix", "mmmu", "image",
               "mooncake", "longbench_v2"])
    a("--dataset-path", type=str, default="")
    a("--model", type=str)
    a("--served-model-name", type=str)
    a("--tokenizer", type=str)
    a("--num-prompts", type=int, default=1000)
    a("--sharegpt-output-len", type=int, default=None)
    a("--sharegpt-context-len", type=int, default=None)
    a("--random-input-len", type=int, default=1024)
    a("--random-output-len", default=1024, type=int)
    a("--random-range-ratio", type=float, default=0.0)
    a("--image-count", type=int, default=1)
    a("--image-resolution", type=str, default="1080p")
    a("--random-image-count", action="store_true")
    a("--image-format", type=str, default="jpeg")
    a("--image-content", type=str, default="random")
    a("--request-rate", type=float, default=float("inf"))
    a("--use-trace-timestamps", action="store_true")
    a("--max-concurrency", type=int, default=None)
    a("--output-file", type=str)
    a("--output-details", action="store_true")
    a("--print-requests", action="store_true")
    a("--disable-tqdm", action="store_true")
    a("--disable-stream", action="store_true")
    a("--return-logprob", action="store_true")
    a("--top-logprobs-num", type=int, default=0)
    a("--token-ids-logprob", type=int, nargs="+", default=None)
    a("--logprob-start-len", type=int, default=-1)
    a("--return-routed-experts", action="store_true")
    a("--seed", type=int, default=1)
    a("--disable-ignore-eos", action="store_true")
    a("--extra-request-body", metavar='{"key1": "value1", "key2": "value2"}', type=str)
    a("--apply-chat-template", action="store_true")
    a("--profile", action="store_true")
    a("--plot-throughput", action="store_true")
    a("--profile-activities", type=str, nargs="+", default=["CPU", "GPU"],
      choices=["CPU", "GPU", "CUDA_PROFILER", "XPU"])
    a("--profile-start-step", type=int, default=None)
    a("--profile-steps", type=int, default=None)
    a("--profile-num-steps", type=int, default=None)
    a("--profile-by-stage", action="store_true", default=False)
    a("--profile-stages", nargs="+", default=None)
    a("--profile-output-dir", type=str, default=None)
    a("--profile-prefix", type=str, default=None)
    a("--lora-name", type=str, nargs="*", default=None, action=LoRAPathAction)
    a("--lora-request-distribution", type=str, default="uniform", choices=["uniform", "distinct", "skewed"])
    a("--lora-zipf-alpha", type=float, default=1.5)
    a("--prompt-suffix", type=str, default="")
    a("--pd-separated", action="store_true")
    urls = p.add_mutually_exclusive_group()
    urls.add_argument("--profile-prefill-url", type=str, nargs="*", default=None)
    urls.add_argument("--profile-decode-url", type=str, nargs="*", default=None)
    a("--flush-cache", action="store_true")
    a("--warmup-requests", type=int, default=1)
    a("--tokenize-prompt", action="store_true")
    gsp = p.add_argument_group("generated-shared-prefix dataset arguments")
    gsp.add_argument("--gsp-num-groups", type=int, default=64)
    gsp.add_argument("--gsp-prompts-per-group", type=int, default=16)
    gsp.add_argument("--gsp-system-prompt-len", type=int, default=2048)
    gsp.add_argument("--gsp-question-len", type=int, default=128)
    gsp.add_argument("--gsp-output-len", type=int, default=256)
    a("--gsp-range-ratio", type=float, default=1.0)
    gsp.add_argument("--gsp-fast-prepare", action="store_true")
    gsp.add_argument("--gsp-send-routing-key", action="store_true")
    gsp.add_argument("--gsp-num-turns", type=int, default=1)
    gsp.add_argument("--gsp-ordered", action="store_true")
    mooncake = p.add_argument_group("mooncake dataset arguments")
    mooncake.add_argument("--mooncake-slowdown-factor", type=float, default=1.0)
    mooncake.add_argument("--mooncake-num-rounds", type=int, default=1)
    mooncake.add_argument("--mooncake-workload", type=str, default="conversation",
                          choices=["mooncake", "conversation", "synthetic", "toolagent"])
    a("--tag", type=str, default=None)
    a("--header", type=str, nargs="+", default=None)
    return p


# ---------------------------------------------------------------------------------------------------------------
class Clock:
    """Simulated seconds from wall time, at the server's time scale once a response has named it."""

    def __init__(self) -> None:
        self.factor = WALL_PER_SIM * time_scale()

    def learn(self, headers) -> None:
        value = headers.get(TIME_SCALE_HEADER) if headers is not None else None
        if value:
            with contextlib.suppress(ValueError):
                self.factor = WALL_PER_SIM * float(value)

    def now(self) -> float:
        return time.perf_counter() / self.factor if self.factor > 0 else time.perf_counter()

    def sleep(self, sim_seconds: float) -> None:
        if sim_seconds > 0 and self.factor > 0:
            time.sleep(sim_seconds * self.factor)


CLOCK = Clock()


def auth_headers() -> dict:
    """bench_serving.get_auth_headers: OPENAI_API_KEY as a bearer token, else API_KEY as given."""
    key = os.environ.get("OPENAI_API_KEY")
    if key:
        return {"Authorization": f"Bearer {key}"}
    key = os.environ.get("API_KEY")
    return {"Authorization": key} if key else {}


def request_headers(args) -> dict:
    headers = auth_headers()
    for item in args.header or []:
        if "=" in item:
            k, v = item.split("=", 1)
            headers[k.strip()] = v.strip()
    return headers


class ConnectError(Exception):
    """What requests says when nothing listens (its message shape: HTTPConnectionPool ... NewConnectionError)."""


def http_request(method: str, url: str, body: dict | None = None, headers: dict | None = None,
                 timeout: float | None = None):
    """One request; returns the open (connection, response). Raises ConnectError when the connection fails."""
    parts = urllib.parse.urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, port, timeout=timeout)
    data = None if body is None else json.dumps(body).encode()
    hdrs = dict(headers or {})
    if data is not None:
        hdrs["Content-Type"] = "application/json"
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    try:
        conn.request(method, path or "/", body=data, headers=hdrs)
        resp = conn.getresponse()
    except OSError as exc:
        conn.close()
        errno_text = f"[Errno {exc.errno}] {exc.strerror}" if exc.errno else str(exc)
        raise ConnectError(
            f"HTTPConnectionPool(host='{parts.hostname}', port={port}): Max retries exceeded with url: {path or '/'} "
            f"(Caused by NewConnectionError('<urllib3.connection.HTTPConnection object at {id(conn):#x}>: "
            f"Failed to establish a new connection: {errno_text}'))") from exc
    CLOCK.learn(resp.headers)
    return conn, resp


def get_json(url: str, headers: dict | None = None, timeout: float | None = None):
    """(status, parsed body or None)."""
    conn, resp = http_request("GET", url, headers=headers, timeout=timeout)
    try:
        raw = resp.read()
        try:
            return resp.status, json.loads(raw or b"null")
        except ValueError:
            return resp.status, None
    finally:
        conn.close()


def wait_for_endpoint(url: str, timeout_sec: int) -> bool:
    print(f"Waiting up to {timeout_sec}s for {url} to become ready...")
    start = time.perf_counter()
    while True:
        try:
            if get_json(url, auth_headers(), timeout=5)[0] == 200:
                print(f"Server ready in {time.perf_counter() - start:.1f}s.")
                return True
        except (ConnectError, OSError):
            pass
        if time.perf_counter() - start >= timeout_sec:
            print(f"Server did not become ready within {timeout_sec}s timeout.")
            return False
        time.sleep(1)


# ---------------------------------------------------------------------------------------------------------------
@dataclass
class Row:
    prompt: str | list[int]
    prompt_len: int
    output_len: int


@dataclass
class Output:
    generated_text: str = ""
    success: bool = False
    latency: float = 0.0
    ttft: float = 0.0
    itl: list = field(default_factory=list)
    prompt_len: int = 0
    error: str = ""
    output_len: int = 0
    start_time: float = 0.0


def random_lens(rng: random.Random, full_len: int, range_ratio: float, num: int) -> list[int]:
    """compute_random_lens: uniform from max(int(full_len * range_ratio), 1) to full_len, both included."""
    if full_len <= 0:
        return [0] * num
    low = max(int(full_len * range_ratio), 1)
    return [rng.randint(low, full_len) for _ in range(num)]


class LocalEntryNotFoundError(FileNotFoundError):
    """huggingface_hub's error when a file is neither reachable on the Hub nor in the local cache; named as
    huggingface_hub names it, so the traceback's last line reads as the real client's."""


LocalEntryNotFoundError.__module__ = "huggingface_hub.errors"


class OfflineModeIsEnabled(ConnectionError):
    """huggingface_hub's error for a request made with HF_HUB_OFFLINE set."""


OfflineModeIsEnabled.__module__ = "huggingface_hub.errors"


class HubConnectError(ConnectionError):
    """httpx's ConnectError, as a host that cannot resolve huggingface.co gets it."""


HubConnectError.__module__ = "httpx"
HubConnectError.__qualname__ = HubConnectError.__name__ = "ConnectError"


def is_file_valid_json(path: str) -> bool:
    """sglang.benchmark.utils.is_file_valid_json."""
    if not os.path.isfile(path):
        return False
    try:
        with open(path) as f:
            json.load(f)
        return True
    except json.JSONDecodeError as e:
        print(f"{path} exists but json loading fails ({e=}), thus treat as invalid file")
        return False


def hf_cache_dir() -> str:
    """huggingface_hub.constants.HF_HUB_CACHE, from the same environment variables."""
    home = os.path.expandvars(os.path.expanduser(os.getenv(
        "HF_HOME", os.path.join(os.getenv("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache")),
                                "huggingface"))))
    legacy = os.getenv("HUGGINGFACE_HUB_CACHE", os.path.join(home, "hub"))
    return os.path.expandvars(os.path.expanduser(os.getenv("HF_HUB_CACHE", legacy)))


def download_and_cache_hf_file(repo_id: str, filename: str, repo_type: str = "dataset") -> str:
    """sglang.benchmark.utils.download_and_cache_hf_file, i.e. huggingface_hub's hf_hub_download, on a host that
    cannot reach the Hub (the lab): the copy in the cache that refs/main names, if there is one (as
    hf_hub_download falls back to it when its HEAD call fails), else its error. The real client first retries
    the HEAD call five times over about 23 s (none with HF_HUB_OFFLINE); the simulator prints those lines
    without the wait."""
    storage = os.path.join(hf_cache_dir(), f"{repo_type}s--{repo_id.replace('/', '--')}")
    ref = os.path.join(storage, "refs", "main")
    if os.path.isfile(ref):
        with open(ref) as f:
            cached = os.path.join(storage, "snapshots", f.read(), filename)
        if os.path.exists(cached):
            return cached
    url = f"{HF_ENDPOINT}/{repo_type}s/{repo_id}/resolve/main/{filename}"
    if os.environ.get("HF_HUB_OFFLINE", os.environ.get("TRANSFORMERS_OFFLINE", "")).upper() in ("1", "ON", "YES",
                                                                                               "TRUE"):
        cause = OfflineModeIsEnabled(f"Cannot reach {url}: offline mode is enabled. To disable it, please unset "
                                     "the `HF_HUB_OFFLINE` environment variable.")
    else:
        cause = HubConnectError("[Errno -2] Name or service not known")
        for attempt, wait in enumerate((1, 2, 4, 8, 8), 1):  # huggingface_hub's http_backoff
            print(f"'{cause}' thrown while requesting HEAD {url}", file=sys.stderr)
            print(f"Retrying in {wait}s [Retry {attempt}/5].", file=sys.stderr)
        print(f"'{cause}' thrown while requesting HEAD {url}", file=sys.stderr)
    raise LocalEntryNotFoundError(
        "An error happened while trying to locate the file on the Hub and we cannot find the requested files"
        " in the local cache. Please check your connection and try again or make sure your Internet connection"
        " is on.") from cause


def encode(text: str) -> list[int]:
    """The simulator's tokenizer: one token per word."""
    return [zlib.crc32(word.encode()) % VOCAB_SIZE for word in text.split()]


def decode(ids: list[int]) -> str:
    """Token ids back to words the simulated server counts as one token each (3 letters and a space)."""
    return " ".join(PROMPT_WORDS[i % len(PROMPT_WORDS)] for i in ids)


def random_requests(args, rng: random.Random) -> list[Row]:
    """sample_random_requests (sglang/benchmark/datasets/random.py): ``random`` repeats or truncates ShareGPT
    prompts to the drawn lengths, ``random-ids`` makes runs of token ids from a random offset; text unless
    --tokenize-prompt (token ids, sent as input_ids)."""
    input_lens = random_lens(rng, args.random_input_len, args.random_range_ratio, args.num_prompts)
    output_lens = random_lens(rng, args.random_output_len, args.random_range_ratio, args.num_prompts)
    return_text = not args.tokenize_prompt  # the simulator's tokenizer adds no special tokens
    rows = []
    if args.dataset_name == "random":
        dataset_path = args.dataset_path
        if not is_file_valid_json(dataset_path):
            dataset_path = download_and_cache_hf_file(repo_id=SHAREGPT_REPO_ID, filename=SHAREGPT_FILENAME)
        with open(dataset_path) as f:
            dataset = json.load(f)
        dataset = [d for d in dataset if len(d.get("conversations", d.get("conversation", []))) >= 2]
        dataset = [(d.get("conversations", d.get("conversation", []))[0]["value"],
                    d.get("conversations", d.get("conversation", []))[1]["value"]) for d in dataset]
        random.shuffle(dataset)  # the module's generator, seeded with --seed, as the real client's
        for prompt, _ in dataset:
            i = len(rows)
            if i == args.num_prompts:
                break
            ids = encode(prompt)
            if not ids:
                continue
            ids = ids[: input_lens[i]] if len(ids) > input_lens[i] else \
                (ids * ((input_lens[i] + len(ids) - 1) // len(ids)))[: input_lens[i]]
            rows.append(Row(decode(ids) if return_text else ids, input_lens[i], output_lens[i]))
    else:
        for i, (n_in, n_out) in enumerate(zip(input_lens, output_lens, strict=True)):
            if return_text:
                # each word is 3 letters and a space: the simulator counts (len + 3) // 4 tokens, so n_in words
                # are n_in tokens
                rows.append(Row(" ".join(rng.choice(PROMPT_WORDS) for _ in range(n_in)), n_in, n_out))
            else:
                offset = rng.randrange(VOCAB_SIZE)
                rows.append(Row([(offset + i + j) % VOCAB_SIZE for j in range(n_in)], n_in, n_out))
    print(f"#Input tokens: {sum(input_lens)}")
    print(f"#Output tokens: {sum(output_lens)}")
    return rows


def generate(args, api_url: str, row: Row, output_len: int, extra_body: dict) -> Output:
    """async_request_sglang_generate: one streamed /generate; TTFT at the first text, ITL spread over a chunk."""
    payload = {("text" if isinstance(row.prompt, str) else "input_ids"): row.prompt,
               "sampling_params": {"temperature": 0.0, "max_new_tokens": output_len,
                                   "ignore_eos": not args.disable_ignore_eos},
               "stream": not args.disable_stream, "lora_path": None, "return_logprob": args.return_logprob,
               "return_routed_experts": args.return_routed_experts, "logprob_start_len": args.logprob_start_len,
               **extra_body}
    out = Output(prompt_len=row.prompt_len, output_len=output_len)
    st = CLOCK.now()
    out.start_time = st
    recent, last_len, ttft, text = st, 0, 0.0, ""
    try:
        conn, resp = http_request("POST", api_url, payload, request_headers(args))
        try:
            if resp.status != 200:
                out.error = (resp.reason or "") + ": " + resp.read().decode(errors="replace")
                return out
            latency = 0.0
            for raw in resp:
                line = raw.strip()
                if not line:
                    continue
                chunk = line.decode()
                chunk = chunk[len("data: "):] if chunk.startswith("data: ") else chunk
                latency = CLOCK.now() - st
                if chunk == "[DONE]":
                    continue
                data = json.loads(chunk)
                if data.get("text"):
                    stamp = CLOCK.now()
                    text = data["text"]
                    got = data["meta_info"]["completion_tokens"]
                    if ttft == 0.0:
                        ttft = stamp - st
                        out.ttft = ttft
                    else:
                        new = got - last_len
                        if new == 0:
                            continue
                        out.itl.extend([(stamp - recent) / new] * new)
                    recent, last_len = stamp, got
                    out.output_len = got
            out.generated_text, out.success, out.latency = text, True, latency
        finally:
            conn.close()
    except Exception:  # noqa: BLE001 - the real client records any failure as the request's error
        out.success = False
        out.error = "".join(traceback.format_exception(*sys.exc_info()))
        print(f"output.error={out.error!r}")
    return out


# ---------------------------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """numpy.percentile's default (linear interpolation)."""
    if not values:
        return 0.0
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def std(values: list[float]) -> float:
    if not values:
        return 0.0
    m = mean(values)
    return math.sqrt(sum((v - m) ** 2 for v in values) / len(values))


def calculate_metrics(rows: list[Row], outputs: list[Output], dur_s: float) -> dict:
    output_lens, retok, itls, tpots, ttfts, e2es = [], [], [], [], [], []
    total_input = completed = 0
    for row, out in zip(rows, outputs, strict=True):
        if not out.success:
            output_lens.append(0)
            retok.append(0)
            continue
        output_lens.append(out.output_len)
        retok.append(len(out.generated_text.split()))
        total_input += row.prompt_len
        if out.output_len > 1:
            tpots.append((out.latency - out.ttft) / (out.output_len - 1))
        itls += out.itl
        ttfts.append(out.ttft)
        e2es.append(out.latency)
        completed += 1
    if completed == 0:
        print("UserWarning: All requests failed. This is likely due to a misconfiguration on the benchmark "
              "arguments.", file=sys.stderr)
    peak_tokens = peak_requests = 0
    good = [o for o in outputs if o.success]
    if good:
        first = min(o.start_time for o in good)
        last = max(o.start_time + o.latency for o in good)
        seconds = int(math.ceil(last - first)) + 1
        tokens, running = [0] * seconds, [0] * seconds
        for o in good:
            t = o.start_time + o.ttft
            stamps = [t]
            for gap in o.itl:
                t += gap
                stamps.append(t)
            for s in stamps:
                bucket = int(s - first)
                if 0 <= bucket < seconds:
                    tokens[bucket] += 1
            for s in range(int(o.start_time - first), min(int(o.start_time + o.latency - first) + 1, seconds)):
                running[s] += 1
        peak_tokens, peak_requests = float(max(tokens)), int(max(running))
    total_output = sum(output_lens)
    ms = 1000.0
    return {
        "completed": completed, "total_input": total_input, "total_input_text": total_input,
        "total_input_vision": 0, "total_output": total_output, "total_output_retokenized": sum(retok),
        "request_throughput": completed / dur_s, "input_throughput": total_input / dur_s,
        "output_throughput": total_output / dur_s, "total_throughput": (total_input + total_output) / dur_s,
        "mean_ttft_ms": mean(ttfts) * ms, "median_ttft_ms": percentile(ttfts, 50) * ms,
        "std_ttft_ms": std(ttfts) * ms, "p99_ttft_ms": percentile(ttfts, 99) * ms,
        "mean_tpot_ms": mean(tpots) * ms, "median_tpot_ms": percentile(tpots, 50) * ms,
        "std_tpot_ms": std(tpots) * ms, "p99_tpot_ms": percentile(tpots, 99) * ms,
        "mean_itl_ms": mean(itls) * ms, "median_itl_ms": percentile(itls, 50) * ms, "std_itl_ms": std(itls) * ms,
        "p95_itl_ms": percentile(itls, 95) * ms, "p99_itl_ms": percentile(itls, 99) * ms,
        "max_itl_ms": (max(itls) if itls else 0.0) * ms,
        "mean_e2e_latency_ms": mean(e2es) * ms, "median_e2e_latency_ms": percentile(e2es, 50) * ms,
        "std_e2e_latency_ms": std(e2es) * ms, "p90_e2e_latency_ms": percentile(e2es, 90) * ms,
        "p99_e2e_latency_ms": percentile(e2es, 99) * ms, "concurrency": sum(e2es) / dur_s,
        "max_output_tokens_per_s": peak_tokens, "max_concurrent_requests": peak_requests,
    }


def print_block(backend: str, request_rate, max_concurrency, m: dict, duration: float, accept_length) -> None:
    """The result block, row for row as benchmark() prints it (labels copied from 0.5.10's bench_serving.py)."""
    def row(label, value, fmt="{:<10}"):
        print(("{:<40} " + fmt).format(label, value))

    def rowf(label, value):
        row(label, value, "{:<10.2f}")

    print("\n{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    row("Backend:", backend)
    row("Traffic request rate:", request_rate)
    row("Max request concurrency:", max_concurrency if max_concurrency else "not set")
    row("Successful requests:", m["completed"])
    rowf("Benchmark duration (s):", duration)
    row("Total input tokens:", m["total_input"])
    row("Total input text tokens:", m["total_input_text"])
    row("Total generated tokens:", m["total_output"])
    row("Total generated tokens (retokenized):", m["total_output_retokenized"])
    rowf("Request throughput (req/s):", m["request_throughput"])
    rowf("Input token throughput (tok/s):", m["input_throughput"])
    rowf("Output token throughput (tok/s):", m["output_throughput"])
    rowf("Peak output token throughput (tok/s):", m["max_output_tokens_per_s"])
    row("Peak concurrent requests:", m["max_concurrent_requests"])
    rowf("Total token throughput (tok/s):", m["total_throughput"])
    rowf("Concurrency:", m["concurrency"])
    if accept_length:
        rowf("Accept length:", accept_length)
    print("{s:{c}^{n}}".format(s="End-to-End Latency", n=50, c="-"))
    rowf("Mean E2E Latency (ms):", m["mean_e2e_latency_ms"])
    rowf("Median E2E Latency (ms):", m["median_e2e_latency_ms"])
    rowf("P90 E2E Latency (ms):", m["p90_e2e_latency_ms"])
    rowf("P99 E2E Latency (ms):", m["p99_e2e_latency_ms"])
    print("{s:{c}^{n}}".format(s="Time to First Token", n=50, c="-"))
    rowf("Mean TTFT (ms):", m["mean_ttft_ms"])
    rowf("Median TTFT (ms):", m["median_ttft_ms"])
    rowf("P99 TTFT (ms):", m["p99_ttft_ms"])
    print("{s:{c}^{n}}".format(s="Time per Output Token (excl. 1st token)", n=50, c="-"))
    rowf("Mean TPOT (ms):", m["mean_tpot_ms"])
    rowf("Median TPOT (ms):", m["median_tpot_ms"])
    rowf("P99 TPOT (ms):", m["p99_tpot_ms"])
    print("{s:{c}^{n}}".format(s="Inter-Token Latency", n=50, c="-"))
    rowf("Mean ITL (ms):", m["mean_itl_ms"])
    rowf("Median ITL (ms):", m["median_itl_ms"])
    rowf("P95 ITL (ms):", m["p95_itl_ms"])
    rowf("P99 ITL (ms):", m["p99_itl_ms"])
    rowf("Max ITL (ms):", m["max_itl_ms"])
    print("=" * 50)


def result_line(args, request_rate, max_concurrency, server_info, duration: float, m: dict, accept_length) -> dict:
    """benchmark()'s ``result`` dict: the JSONL keys of 0.5.10, in its order."""
    keys = ("total_input_tokens", "total_input_text_tokens", "total_input_vision_tokens", "total_output_tokens",
            "total_output_tokens_retokenized")
    sources = ("total_input", "total_input_text", "total_input_vision", "total_output", "total_output_retokenized")
    result = {
        "tag": args.tag, "backend": args.backend, "dataset_name": args.dataset_name,
        "request_rate": request_rate, "max_concurrency": max_concurrency,
        "sharegpt_output_len": args.sharegpt_output_len, "random_input_len": args.random_input_len,
        "random_output_len": args.random_output_len, "random_range_ratio": args.random_range_ratio,
        "server_info": server_info, "duration": duration, "completed": m["completed"],
    }
    result.update({k: m[s] for k, s in zip(keys, sources, strict=True)})
    for k in ("request_throughput", "input_throughput", "output_throughput", "total_throughput",
              "mean_e2e_latency_ms", "median_e2e_latency_ms", "std_e2e_latency_ms", "p90_e2e_latency_ms",
              "p99_e2e_latency_ms", "mean_ttft_ms", "median_ttft_ms", "std_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
              "median_tpot_ms", "std_tpot_ms", "p99_tpot_ms", "mean_itl_ms", "median_itl_ms", "std_itl_ms",
              "p95_itl_ms", "p99_itl_ms", "concurrency"):
        result[k] = m[k]
    result["accept_length"] = accept_length
    result["max_output_tokens_per_s"] = m["max_output_tokens_per_s"]
    result["max_concurrent_requests"] = m["max_concurrent_requests"]
    return result


def progress(done: int, total: int, started: float) -> None:
    """tqdm's closing line, on stderr."""
    elapsed = time.perf_counter() - started
    mins, secs = divmod(int(elapsed), 60)
    rate = done / elapsed if elapsed > 0 else 0.0
    print(f"100%|{'█' * 60}| {done}/{total} [{mins:02d}:{secs:02d}<00:00, {rate:.2f}it/s]", file=sys.stderr)


def benchmark(args, api_url: str, base_url: str, rows: list[Row], extra_body: dict) -> dict:
    print(f"Starting warmup with {args.warmup_requests} sequences...")
    first = rows[0]
    warm = [generate(args, api_url, first, min(first.output_len, 32), extra_body)
            for _ in range(args.warmup_requests)]
    if args.warmup_requests > 0 and not any(o.success for o in warm):
        raise ValueError("Warmup failed - Please make sure benchmark arguments "
                         f"are correctly specified. Error: {warm[0].error}")
    print(f"Warmup completed with {args.warmup_requests} sequences. Starting main benchmark run...")
    if os.environ.get("SGLANG_IS_IN_CI", "false").lower() in ("true", "1") or args.flush_cache:
        http_request("POST", base_url + "/flush_cache", headers=auth_headers())[0].close()
    CLOCK.sleep(1.0)

    rng = random.Random(args.seed)  # Poisson arrivals, as np.random.exponential(1 / rate)
    workers = args.max_concurrency or len(rows)  # the pool's queue is the real client's semaphore
    started_wall = time.perf_counter()
    start = CLOCK.now()
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        futures = []
        for row in rows:
            futures.append(pool.submit(generate, args, api_url, row, row.output_len, extra_body))
            if args.request_rate != float("inf"):
                CLOCK.sleep(rng.expovariate(args.request_rate))
        outputs = [f.result() for f in futures]
    if not args.disable_tqdm:
        progress(len(outputs), len(rows), started_wall)

    accept_length = None
    status, info = get_json(base_url + "/server_info", auth_headers())
    if status == 200 and isinstance(info, dict):
        if "decode" in info:
            info = info["decode"][0]
        states = info.get("internal_states")
        if states:
            accept_length = states[0].get("avg_spec_accept_length")
    duration = CLOCK.now() - start
    m = calculate_metrics(rows, outputs, duration)
    print_block(args.backend, args.request_rate, args.max_concurrency, m, duration, accept_length)
    status, server_info = get_json(base_url + "/server_info", auth_headers())
    result = result_line(args, args.request_rate, args.max_concurrency, server_info if status == 200 else None,
                         duration, m, accept_length)
    if args.output_file:
        name = args.output_file
    else:
        name = (f"{args.backend}_{datetime.now().strftime('%m%d')}_{args.num_prompts}_{args.random_input_len}_"
                f"{args.random_output_len}.jsonl")
    details = {"input_lens": [o.prompt_len for o in outputs], "output_lens": [o.output_len for o in outputs],
               "ttfts": [o.ttft for o in outputs], "itls": [o.itl for o in outputs],
               "generated_texts": [o.generated_text for o in outputs], "errors": [o.error for o in outputs]}
    with open(name, "a") as fh:
        fh.write(json.dumps(result | details if args.output_details else result) + "\n")
    return result | details


def host_url(host: str, port: int) -> str:
    """sglang.srt.utils.network.NetworkAddress(host, port).to_url(): brackets around an IPv6 address are taken
    off, then put around every IPv6 address (``::1`` and ``[::1]`` both give ``http://[::1]:PORT``)."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        ipaddress.IPv6Address(host)
        host = f"[{host}]"
    except ValueError:
        pass
    return f"http://{host}:{port}"


def run_benchmark(args) -> dict:
    print(f"benchmark_args={args}")
    random.seed(args.seed)
    extra_body = json.loads(args.extra_request_body) if args.extra_request_body else {}
    if args.tokenize_prompt:
        assert args.backend == "sglang", "`--tokenize-prompt` only compatible with `--backend sglang` currently"
    if args.port is None:
        args.port = DEFAULT_PORTS.get(args.backend, 30000)
    host_base = host_url(args.host, args.port)
    model_url = f"{args.base_url}/v1/models" if args.base_url else f"{host_base}/v1/models"
    if args.backend not in DRIVEN_BACKENDS:
        print(f"The simulated bench_serving drives SGLang's /generate only (--backend sglang or sglang-native); "
              f"--backend {args.backend} is not simulated.")
        sys.exit(1)
    api_url = f"{args.base_url}/generate" if args.base_url else f"{host_base}/generate"
    base_url = host_base if args.base_url is None else args.base_url
    if args.ready_check_timeout_sec > 0 and not wait_for_endpoint(model_url, args.ready_check_timeout_sec):
        print(f"Server at {model_url} is not ready. Exiting.")
        sys.exit(1)
    if args.model is None:
        try:
            _, body = get_json(model_url, auth_headers())
            models = (body or {}).get("data", [])
            args.model = models[0]["id"] if models else None
        except Exception as exc:  # noqa: BLE001 - as the real client: any failure, one sentence
            print(f"Failed to fetch model from {model_url}. Error: {exc}")
            print("Please specify the correct host and port using `--host` and `--port`.")
            sys.exit(1)
    if args.model is None:
        print("No model specified or found. Please provide a model using `--model`.")
        sys.exit(1)
    if args.dataset_name not in GENERATED_DATASETS:
        print(f"The simulated bench_serving generates the random datasets only (--dataset-name random or "
              f"random-ids); --dataset-name {args.dataset_name} is not simulated.")
        sys.exit(1)
    print(f"{args}\n")
    rows = random_requests(args, random.Random(args.seed))
    return benchmark(args, api_url, base_url, rows, extra_body)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    run_benchmark(args)


if __name__ == "__main__":
    main()
