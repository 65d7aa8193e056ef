"""SGLang's Prometheus metrics (--enable-metrics), served at /metrics on the serving port, as the release the
simulator is (_sim/release.py): 0.5.10's families below, and where 0.5.23's collectors differ (RELEASE_0_5_23 at the
end of this docstring), 0.5.23's.

Real SGLang runs prometheus_client in multiprocess mode (utils/common.py set_prometheus_multiproc_dir): every
scheduler process and the main process (TokenizerManager, the HTTP middleware) write their own files, and
/metrics (add_prometheus_middleware, mounted with the path regex ``^/metrics(?P<path>.*)$``) answers with a
MultiProcessCollector's merge of them, in the format the client's Accept header picks (exposition.py
choose_encoder), gzipped when it accepts gzip. This module writes that answer by hand (the simulator has no
dependency on prometheus_client): the same families, HELP text, types, label names and values, buckets and
number formatting, for the families below; tests/oracle/test_metrics.py holds it against the wheel.

- Schedulers (observability/metrics_collector.py SchedulerMetricsCollector.log_stats, scheduler_metrics_mixin.py
  init_metrics): the gauges log_stats sets, for each scheduler whose ``current_scheduler_metrics_enabled`` is
  true: ``enable_metrics and (attn_tp_rank == 0 or enable_metrics_for_all_schedulers)``, attn_tp_rank being
  ``tp_rank % (tp_size // attn_dp_size)`` (layers/dp_attention.py compute_dp_attention_world_info; attn_dp_size is
  dp_size with DP attention, else 1). Labels model_name, engine_type, tp_rank, pp_rank, moe_ep_rank, and dp_rank
  where the scheduler has one (dp_size > 1). Most are ``multiprocess_mode="mostrecent"``; num_retracted_reqs and
  num_paused_reqs keep the default mode ``all`` and so carry the scheduler process's ``pid``.
  sglang:cache_config_info (page_size, num_pages) is set by every scheduler (scheduler.py, init_memory_pool),
  one series.
- TokenizerManager (TokenizerMetricsCollector, label model_name): the request counters and the TTFT, inter-token,
  end-to-end latency and retraction histograms, observed per request as tokenizer_manager.collect_metrics does:
  a streamed request outputs every token, a non-streamed one every 50 tokens
  (scheduler_output_processor_mixin.py DEFAULT_FORCE_STREAM_INTERVAL) and at its end; the first output gives
  the TTFT, each later one an inter-token observation of (interval, new tokens).
- The HTTP middleware (utils/common.py add_prometheus_track_response_middleware): requests, responses and
  active requests by endpoint (the route's path), and routing_keys_active. The API-key middleware sits outside
  it, so a 401 is not counted.

Where 0.5.23 differs (its observability/metrics_collector.py): log_stats sets another list of gauges
(SCHEDULER_GAUGES_0_5_23: kv_/swa_/mamba_ token counts, spec_ and PD gauges; no num_running_reqs_offline_batch,
num_prefill_prealloc_queue_reqs, engine_startup_time, engine_load_weights_time); sglang:cache_config_info is gone and
every scheduler with a collector (every rank with --enable-metrics) emits its constants once at start
(Scheduler.emit_metrics_constants: max_total_num_tokens, weight and KV-cache memory, graph memory by phase, page_size,
num_pages, context_len); the tokenizer's labels add engine_type, the request counters and the TTFT and end-to-end
histograms an ``is_streaming`` label, a finished request is also observed in request_time_per_output_token_seconds
(more than one token) and the prompt, uncached-prompt and generation token histograms, and sglang:num_retractions is
gone.

Times are the simulator's simulated seconds. What the simulator leaves out is listed in sim/sglang/README.md.
"""

from __future__ import annotations

import gzip
import math
import threading

from . import release as R
from . import throughput as T

# prometheus_client 0.26 (what `pip install sglang==0.5.10` resolves prometheus-client>=0.20.0 to)
PLAIN_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
PLAIN_1_0_0 = "text/plain; version=1.0.0; charset=utf-8"
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"
ALLOWUTF8, UNDERSCORES, DOTS, VALUES = "allow-utf-8", "underscores", "dots", "values"
ESCAPINGS = (ALLOWUTF8, UNDERSCORES, DOTS, VALUES)

# TokenizerMetricsCollector's default buckets (no --bucket-* flags in the simulator)
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080, 0.100,
               0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000)
RETRACTIONS_BUCKETS = (0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 15, 20, 25, 30, 40, 50, 75, 100)
ROUTING_KEY_BOUNDS = (1, 2, 3, 5, 7, 10, 20, 50, 100, 200)  # ROUTING_KEY_REQ_COUNT_BUCKET_BOUNDS
FORCE_STREAM_INTERVAL = 50  # DEFAULT_FORCE_STREAM_INTERVAL: a non-streamed request's outputs
INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO's default

# (name, HELP) of the gauges SchedulerMetricsCollector.log_stats sets, in its order; "pid": multiprocess_mode "all"
SCHEDULER_GAUGES = [
    ("sglang:num_running_reqs", "The number of running requests."),
    ("sglang:num_used_tokens", "The number of used tokens."),
    ("sglang:token_usage", "The token usage."),
    ("sglang:full_token_usage", "The token usage for full attention layers."),
    ("sglang:pending_prealloc_token_usage", "The token usage for pending preallocated tokens (not preallocated yet)."),
    ("sglang:swa_token_usage", "The token usage for SWA layers."),
    ("sglang:mamba_usage", "The token usage for Mamba layers."),
    ("sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode."),
    ("sglang:gen_throughput", "The generation throughput (token/s)."),
    ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    ("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."),
    ("sglang:num_running_reqs_offline_batch",
     "The number of running low-priority offline batch requests(label is 'batch')."),
    ("sglang:cache_hit_rate", "The prefix cache hit rate."),
    ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    ("sglang:spec_accept_length", "The average acceptance length of speculative decoding."),
    ("sglang:spec_accept_rate",
     "The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` in batch)."),
    ("sglang:num_prefill_prealloc_queue_reqs", "The number of requests in the prefill prealloc queue."),
    ("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue."),
    ("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."),
    ("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."),
    ("sglang:num_retracted_reqs", "The number of retracted requests.", "pid"),
    ("sglang:num_paused_reqs", "The number of paused requests by async weight sync.", "pid"),
    ("sglang:utilization", "The utilization."),
    ("sglang:engine_startup_time", "The time taken for the engine to start up."),
    ("sglang:engine_load_weights_time", "The time taken for the engine to load weights."),
    ("sglang:new_token_ratio", "The new token ratio."),
    ("sglang:is_cuda_graph", "Whether the batch is using CUDA graph."),
    ("sglang:num_unique_running_routing_keys", "Number of unique routing keys in running batch."),
]
ROUTING_KEY_GAUGES = [  # GaugeHistogram: a gauge with gt/le labels
    ("sglang:routing_key_running_req_count",
     "Distribution of routing keys by running request count (gt < count <= le)."),
    ("sglang:routing_key_all_req_count",
     "Distribution of routing keys by running+waiting request count (gt < count <= le)."),
]
CACHE_CONFIG_INFO = ("sglang:cache_config_info", "Cache configuration information.")
TOKENIZER_HISTOGRAMS = [  # (name, HELP, buckets), in TokenizerMetricsCollector's order
    ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS),
    ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS),
    ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", E2E_BUCKETS),
    ("sglang:num_retractions", "Histogram of retraction counts per request.", RETRACTIONS_BUCKETS),
]
TOKENIZER_COUNTERS = [
    ("sglang:prompt_tokens_total", "Number of prefill tokens processed."),
    ("sglang:generation_tokens_total", "Number of generation tokens processed."),
    ("sglang:num_requests_total", "Number of requests processed."),
]
HTTP_REQUESTS = ("sglang:http_requests_total", "Total number of HTTP requests by endpoint and method")
HTTP_RESPONSES = ("sglang:http_responses_total", "Total number of HTTP responses by endpoint and status code")
HTTP_ACTIVE = ("sglang:http_requests_active", "Number of currently active HTTP requests")
ROUTING_KEYS_ACTIVE = ("sglang:routing_keys_active", "Number of unique routing keys with active requests")

# --- 0.5.23 (observability/metrics_collector.py of that wheel) ---------------------------------------------------
# (name, HELP) of the gauges its SchedulerMetricsCollector.log_stats sets, in its order; "pid": multiprocess_mode
# "all"
SCHEDULER_GAUGES_0_5_23 = [
    ("sglang:num_running_reqs", "The number of running requests."),
    ("sglang:num_queue_reqs", "The number of requests in the waiting queue."),
    ("sglang:num_grammar_queue_reqs", "The number of requests in the grammar waiting queue."),
    ("sglang:gen_throughput", "The generation throughput (token/s)."),
    ("sglang:cache_hit_rate", "The prefix cache hit rate."),
    ("sglang:decode_sum_seq_lens", "The sum of all sequence lengths in decode."),
    ("sglang:token_usage", "The token usage."),
    ("sglang:full_token_usage", "The token usage for full attention layers."),
    ("sglang:swa_token_usage", "The token usage for SWA layers."),
    ("sglang:mamba_usage", "The token usage for Mamba layers."),
    ("sglang:num_used_tokens", "The number of used tokens."),
    ("sglang:kv_available_tokens", "Number of free token slots in the KV cache pool."),
    ("sglang:kv_evictable_tokens", "Number of evictable (radix-cached) token slots in the KV cache pool."),
    ("sglang:kv_used_tokens", "Number of actively used token slots in the KV cache pool."),
    ("sglang:swa_available_tokens", "Number of free token slots in the SWA pool (hybrid-SWA only)."),
    ("sglang:swa_evictable_tokens", "Number of evictable (radix-cached) token slots in the SWA pool."),
    ("sglang:swa_used_tokens", "Number of actively used token slots in the SWA pool."),
    ("sglang:mamba_available_tokens", "Number of free state slots in the mamba SSM pool (hybrid-SSM only)."),
    ("sglang:mamba_evictable_tokens", "Number of evictable (radix-cached) state slots in the mamba SSM pool."),
    ("sglang:mamba_used_tokens", "Number of actively used state slots in the mamba SSM pool."),
    ("sglang:spec_accept_length",
     "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward)."),
    ("sglang:spec_accept_rate", "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch)."),
    ("sglang:spec_cap_length", "Mean DSpark confidence-scheduled verify window per verify step, incl the bonus slot "
                               "(0 when no cap is scheduled)."),
    ("sglang:spec_block_accept_length", "Mean uncapped full-block accept length per verify step (accept + "
                                        "cap-trimmed drafts; exact only in DSpark cap-accept mode)."),
    ("sglang:spec_num_steps", "Currently active speculative_num_steps."),
    ("sglang:spec_num_draft_tokens", "Currently active speculative_num_draft_tokens (decouples from steps under "
                                     "topk>1)."),
    ("sglang:num_retracted_reqs", "The number of retracted requests.", "pid"),
    ("sglang:num_paused_reqs", "The number of paused requests by async weight sync.", "pid"),
    ("sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue."),
    ("sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue."),
    ("sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue."),
    ("sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue."),
    ("sglang:num_decode_host_receive_queue_reqs",
     "Requests in the decode transfer queue receiving into host memory or waiting for device admission."),
    ("sglang:num_decode_deferred_kv_release_reqs", "The number of failed decode requests whose KV allocations are "
                                                   "held pending transfer drain acknowledgement or timeout."),
    ("sglang:pending_prealloc_token_usage", "The token usage for pending preallocated tokens (not preallocated yet)."),
    ("sglang:prealloc_full_token_usage", "Share of the full-attention KV pool held by decode requests whose KV "
                                         "transfer is pending (preallocated, not yet running); same capacity basis "
                                         "as sglang:full_token_usage."),
    ("sglang:prealloc_swa_token_usage", "Share of the SWA KV pool held by decode requests whose KV transfer is "
                                        "pending; same capacity basis as sglang:swa_token_usage."),
    ("sglang:utilization", "The utilization."),
    ("sglang:fwd_occupancy", "Forward pass GPU occupancy percentage."),
    ("sglang:new_token_ratio", "The new token ratio."),
    ("sglang:is_cuda_graph", "Whether the batch is using CUDA graph."),
    ("sglang:num_unique_running_routing_keys", "Number of unique routing keys in running batch."),
]
# What SchedulerMetricsCollector.emit_constants sets, in its order (0.5.23's startup_available_gpu_memory_gb is left
# out: README.md); graph_memory_usage_gb has a series per phase (model_executor/graph_memory_usage.py)
CONSTANTS_0_5_23 = [
    ("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
    ("sglang:weight_memory_usage_gb", "Memory used by model weights in GB."),
    ("sglang:kv_cache_memory_usage_gb", "Memory used by the KV cache pools in GB."),
    ("sglang:graph_memory_usage_gb", "Memory used by captured device graphs in GB."),
    ("sglang:page_size", "KV cache page size in tokens."),
    ("sglang:num_pages", "Number of KV cache pages."),
    ("sglang:context_len", "Maximum context length."),
]
GRAPH_PHASES = ("prefill", "decode", "target_verify", "draft_prefill", "draft_decode", "draft_extend")
# TokenizerMetricsCollector's default prompt/generation token buckets (generate_buckets with no --*-buckets flag)
TOKEN_BUCKETS = (100, 300, 500, 700, 1000, 1500, 2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12500, 15000,
                 17500, 20000, 22500, 25000, 27500, 30000, 35000, 40000, 60000, 80000, 100000, 200000, 300000, 400000,
                 600000, 800000, 1000000, 1100000)
# (name, HELP, buckets, whether it has the is_streaming label), in TokenizerMetricsCollector's order
TOKENIZER_HISTOGRAMS_0_5_23 = [
    ("sglang:prompt_tokens_histogram", "Histogram of prompt token length.", TOKEN_BUCKETS, False),
    ("sglang:uncached_prompt_tokens_histogram", "Histogram of uncached (compute) prompt token length.", TOKEN_BUCKETS,
     False),
    ("sglang:generation_tokens_histogram", "Histogram of generation token length.", TOKEN_BUCKETS, False),
    ("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS, True),
    ("sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS, False),
    ("sglang:request_time_per_output_token_seconds",
     "Per-request TPOT in seconds: (finished_time - first_token_time) / (completion_tokens - 1).", ITL_BUCKETS, True),
    ("sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds", E2E_BUCKETS, True),
]


def go_float(value: float) -> str:
    """prometheus_client.utils.floatToGoString."""
    d = float(value)
    if d == math.inf:
        return "+Inf"
    if d == -math.inf:
        return "-Inf"
    if math.isnan(d):
        return "NaN"
    s = repr(d)
    dot = s.find(".")
    if d > 0 and dot > 6:
        mantissa = f"{s[0]}.{s[1:dot]}{s[dot + 1:]}".rstrip("0.")
        return f"{mantissa}e+{dot - 1:02d}"
    return s


def attn_tp_rank(tp_rank: int, tp_size: int, dp_size: int, dp_attention: bool) -> int:
    """layers/dp_attention.py compute_dp_attention_world_info (attn_cp_size 1)."""
    return tp_rank % (tp_size // (dp_size if dp_attention else 1))


def collector_labels(args, rank) -> dict[str, str] | None:
    """The labels of `rank`'s SchedulerMetricsCollector, which every scheduler has with --enable-metrics, else
    None."""
    if not args.enable_metrics:
        return None
    labels = {"model_name": args.served_model_name, "engine_type": "unified", "tp_rank": str(rank.tp_rank),
              "pp_rank": str(rank.pp_rank), "moe_ep_rank": str(rank.moe_ep_rank)}
    if rank.dp_size > 1:  # the DP controller hands each scheduler its dp_rank
        labels["dp_rank"] = str(rank.dp_rank)
    return labels


def scheduler_labels(args, rank) -> dict[str, str] | None:
    """The labels of `rank`'s SchedulerMetricsCollector when it exports its stats (init_metrics'
    current_scheduler_metrics_enabled), else None."""
    labels = collector_labels(args, rank)
    if labels is None or (attn_tp_rank(rank.tp_rank, rank.tp_size, rank.dp_size, rank.dp_attention) != 0
                          and not args.enable_metrics_for_all_schedulers):
        return None
    return labels


class Histogram:
    def __init__(self, bounds):
        self.bounds = [float(b) for b in bounds] + [math.inf]
        self.counts = [0.0] * len(self.bounds)
        self.sum = 0.0

    def observe(self, value: float, n: int = 1, total: float | None = None) -> None:
        """One observation, or (observe_inter_token_latency) n at value with `total` added to the sum."""
        self.sum += value if total is None else total
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += n
                break

    def samples(self, name: str, labels: dict) -> list:
        out = [(name + "_sum", labels, self.sum)]
        acc = 0.0
        for bound, count in zip(self.bounds, self.counts, strict=True):
            acc += count
            out.append((name + "_bucket", {**labels, "le": go_float(bound)}, acc))
        out.append((name + "_count", labels, acc))
        return out


class Request:
    """One request in flight: its DP rank, prompt and decoded tokens, and its outputs so far."""

    def __init__(self, dp: int, prompt_tokens: int, start: float, stream: bool):
        self.dp, self.prompt_tokens, self.start, self.stream = dp, prompt_tokens, start, stream
        self.done = 0
        self.sent = 0  # tokens output to the tokenizer so far
        self.last = start  # time of the last output
        self.first_token: float | None = None  # when its first token was decoded (the scheduler's first_token_time)
        self.ttft_observed = False


class Metrics:
    def __init__(self, args, plan, pids: list[int], speed: tuple[float, float]):
        self.args, self.plan, self.speed = args, plan, speed
        self.release = getattr(args, "release", None) or R.current()
        self.lock = threading.Lock()
        self.dp_size = max(1, int(args.dp_size or 1))
        self.inflight: list[Request] = []
        self.schedulers = []  # (labels, dp rank, pid)
        for rp, pid in zip(plan.ranks, pids, strict=True):
            labels = scheduler_labels(args, rp.rank)
            if labels is not None:
                self.schedulers.append((labels, rp.rank.dp_rank if self.dp_size > 1 else 0, pid))
        self.logged = False  # the schedulers have run log_stats (the warm-up's prefill, or the idle check)
        # The tokenizer's series, by (family, is_streaming or None): in multiprocess mode a family shows once it has
        # a series, that is once something was observed in it.
        new = self.release != "0.5.10"
        self.histogram_families = TOKENIZER_HISTOGRAMS_0_5_23 if new else [
            (name, help_, buckets, False) for name, help_, buckets in TOKENIZER_HISTOGRAMS]
        self.streamed = {name for name, _, _, streamed in self.histogram_families if streamed}
        if new:
            self.streamed |= {name for name, _ in TOKENIZER_COUNTERS}
        self.buckets = {name: buckets for name, _, buckets, _ in self.histogram_families}
        self.histograms: dict[tuple[str, str | None], Histogram] = {}
        self.counters: dict[tuple[str, str | None], float] = {}
        self.http_requests: dict[tuple[str, str], float] = {}
        self.http_responses: dict[tuple[str, str, str], float] = {}
        self.http_active: dict[tuple[str, str], float] = {}

    # --- what the server tells it --------------------------------------------------------------
    def warmed_up(self, skipped: bool) -> None:
        """The server is ready: the schedulers have logged their stats; the warm-up request (unless skipped), 8
        tokens not streamed, went through the tokenizer: its first output was its last (no inter-token
        observation). Its own counts are left out (see README): its families show, at 0."""
        with self.lock:
            self.logged = True
            if not skipped:
                for name, _ in TOKENIZER_COUNTERS:
                    self._count(name, 0.0, False)
                for name in self.buckets:
                    if name != "sglang:inter_token_latency_seconds":
                        self.histograms.setdefault((name, self._streaming(name, False)), Histogram(self.buckets[name]))

    def begin(self, dp: int, prompt_tokens: int, start: float, stream: bool) -> Request:
        """A request reaches DP rank `dp`'s scheduler(s) at simulated time `start`."""
        with self.lock:
            req = Request(dp, prompt_tokens, start, stream)
            self.inflight.append(req)
            return req

    def decoded(self, req: Request, done: int, t: float, step_start: float, step_done: int, total: int) -> None:
        """`req` has decoded `done` tokens by simulated time `t` (this step began at step_start with step_done
        tokens). Outputs the tokenizer sees in the step are observed as collect_metrics does."""
        with self.lock:
            req.done = done
            if req.first_token is None and done > step_done:
                per_token = (t - step_start) / (done - step_done)
                req.first_token = step_start + per_token if step_done == 0 else t
            if req.stream:
                points = [(t, done)]
            else:
                marks = range((step_done // FORCE_STREAM_INTERVAL + 1) * FORCE_STREAM_INTERVAL, done + 1,
                              FORCE_STREAM_INTERVAL)
                rate = (done - step_done) / (t - step_start) if t > step_start else 0.0
                points = [(step_start + (m - step_done) / rate if rate else t, m) for m in marks]
                if done == total and (not points or points[-1][1] != done):
                    points.append((t, done))
            for when, tokens in points:
                self._output(req, when, tokens)

    def _output(self, req: Request, when: float, tokens: int) -> None:
        if not req.ttft_observed:
            req.ttft_observed = True
            self._observe("sglang:time_to_first_token_seconds", req.stream, when - req.start)
        elif tokens > req.sent:
            interval = when - req.last
            self._observe("sglang:inter_token_latency_seconds", req.stream, interval / (tokens - req.sent),
                          tokens - req.sent, interval)
        else:
            return
        req.sent, req.last = tokens, when

    def _streaming(self, name: str, stream: bool) -> str | None:
        """The series' is_streaming label (0.5.23's request families), or None where the family has none."""
        return ("true" if stream else "false") if name in self.streamed else None

    def _observe(self, name: str, stream: bool, value: float, n: int = 1, total: float | None = None) -> None:
        key = (name, self._streaming(name, stream))
        self.histograms.setdefault(key, Histogram(self.buckets[name])).observe(value, n, total)

    def _count(self, name: str, value: float, stream: bool) -> None:
        key = (name, self._streaming(name, stream))
        self.counters[key] = self.counters.get(key, 0.0) + value

    def finish(self, req: Request, completion_tokens: int, end: float) -> None:
        with self.lock:
            if not req.ttft_observed:  # nothing decoded: the final output is the first
                self._output(req, end, completion_tokens)
            self._count("sglang:prompt_tokens_total", req.prompt_tokens, req.stream)
            self._count("sglang:generation_tokens_total", completion_tokens, req.stream)
            self._count("sglang:num_requests_total", 1, req.stream)
            self._observe("sglang:e2e_request_latency_seconds", req.stream, end - req.start)
            if self.release == "0.5.10":
                self._observe("sglang:num_retractions", req.stream, 0)
            else:  # observe_one_finished_request
                first = end if req.first_token is None else req.first_token
                if completion_tokens > 1 and end > first:  # ReqTimeStats.get_time_per_output_token
                    self._observe("sglang:request_time_per_output_token_seconds", req.stream,
                                  (end - first) / (completion_tokens - 1))
                self._observe("sglang:prompt_tokens_histogram", req.stream, req.prompt_tokens)
                self._observe("sglang:uncached_prompt_tokens_histogram", req.stream, req.prompt_tokens)
                self._observe("sglang:generation_tokens_histogram", req.stream, completion_tokens)
            if req in self.inflight:
                self.inflight.remove(req)

    def abort(self, req: Request) -> None:
        """The client went away: the request leaves the batch, and counts as no finished request."""
        with self.lock:
            if req in self.inflight:
                self.inflight.remove(req)

    def http_begin(self, endpoint: str, method: str) -> None:
        with self.lock:
            key = (endpoint, method)
            self.http_requests[key] = self.http_requests.get(key, 0.0) + 1
            self.http_active[key] = self.http_active.get(key, 0.0) + 1

    def http_end(self, endpoint: str, method: str, status: int) -> None:
        with self.lock:
            key = (endpoint, method, str(status))
            self.http_responses[key] = self.http_responses.get(key, 0.0) + 1
            self.http_active[(endpoint, method)] = self.http_active.get((endpoint, method), 1.0) - 1

    # --- the answer ----------------------------------------------------------------------------
    def families(self) -> list[tuple[str, str, str, list]]:
        """[(family name as the text format's TYPE line has it, type, HELP, [(sample, labels, value)])]."""
        with self.lock:
            out = []
            labels = {"model_name": self.args.served_model_name}
            if self.release != "0.5.10":  # tokenizer_metric_labels
                labels["engine_type"] = "unified"

            def series(key: tuple[str, str | None]) -> dict:
                return labels if key[1] is None else {**labels, "is_streaming": key[1]}

            for name, help_, _, _ in self.histogram_families:
                keys = sorted(k for k in self.histograms if k[0] == name)
                if keys:
                    out.append((name, "histogram", help_,
                                [s for k in keys for s in self.histograms[k].samples(name, series(k))]))
            if self.release != "0.5.10":
                out += self._constants()
            if self.logged:
                out += self._scheduler_families()
            for name, help_ in TOKENIZER_COUNTERS:
                keys = sorted(k for k in self.counters if k[0] == name)
                if keys:
                    out.append((name, "counter", help_, [(name, series(k), self.counters[k]) for k in keys]))
            out.append((HTTP_REQUESTS[0], "counter", HTTP_REQUESTS[1], [
                (HTTP_REQUESTS[0], {"endpoint": e, "method": m}, v) for (e, m), v in self.http_requests.items()]))
            out.append((HTTP_RESPONSES[0], "counter", HTTP_RESPONSES[1], [
                (HTTP_RESPONSES[0], {"endpoint": e, "method": m, "status_code": c}, v)
                for (e, m, c), v in self.http_responses.items()]))
            out.append((HTTP_ACTIVE[0], "gauge", HTTP_ACTIVE[1], [
                (HTTP_ACTIVE[0], {"endpoint": e, "method": m}, v) for (e, m), v in self.http_active.items()]))
            out.append((ROUTING_KEYS_ACTIVE[0], "gauge", ROUTING_KEYS_ACTIVE[1], [(ROUTING_KEYS_ACTIVE[0], {}, 0.0)]))
            return [f for f in out if f[3]]

    def _constants(self) -> list:
        """0.5.23's Scheduler.emit_metrics_constants, on every scheduler with a collector (every rank)."""
        from .plan import PREFILL_GRAPH_BYTES_PER_SIZE

        plan, args, gib = self.plan, self.args, float(1 << 30)
        prefill = args.graphs["prefill"]
        prefill_bytes = 0 if prefill["backend"] == "disabled" else PREFILL_GRAPH_BYTES_PER_SIZE * len(prefill["bs"])
        samples = {name: [] for name, _ in CONSTANTS_0_5_23}
        for rp in plan.ranks:
            labels = collector_labels(args, rp.rank)
            graph = {phase: 0.0 for phase in GRAPH_PHASES}
            graph["prefill"] = min(prefill_bytes, rp.graph_bytes) / gib
            graph["decode"] = max(0, rp.graph_bytes - prefill_bytes) / gib
            values = {"sglang:max_total_num_tokens": plan.max_total_num_tokens,
                      "sglang:weight_memory_usage_gb": rp.weights_gib_reported,
                      "sglang:kv_cache_memory_usage_gb": rp.kv_bytes / gib, "sglang:page_size": args.page_size,
                      "sglang:num_pages": plan.max_total_num_tokens // max(1, args.page_size),
                      "sglang:context_len": plan.context_len}
            for name, _ in CONSTANTS_0_5_23:
                if name == "sglang:graph_memory_usage_gb":
                    samples[name] += [(name, {**labels, "phase": phase}, float(v)) for phase, v in graph.items()]
                else:
                    samples[name].append((name, labels, float(values[name])))
        return [(name, "gauge", help_, samples[name]) for name, help_ in CONSTANTS_0_5_23]

    def _scheduler_families(self) -> list:
        plan, args = self.plan, self.args
        total = len(self.inflight)
        rate = T.aggregate(total, *self.speed) / total if total else 0.0  # each request's decode speed
        cap = max(1, plan.max_running_requests)
        per_dp = {}
        for d in range(self.dp_size):
            reqs = [r for r in self.inflight if r.dp == d]
            running = min(len(reqs), cap)
            used = sum(r.prompt_tokens + r.done for r in reqs[:running])
            per_dp[d] = {
                "sglang:num_running_reqs": running, "sglang:num_used_tokens": used,
                "sglang:token_usage": used / plan.max_total_num_tokens if plan.max_total_num_tokens else 0.0,
                "sglang:decode_sum_seq_lens": used, "sglang:gen_throughput": rate * running,
                "sglang:num_queue_reqs": len(reqs) - running, "sglang:max_total_num_tokens": plan.max_total_num_tokens,
                "sglang:new_token_ratio": min(INIT_NEW_TOKEN_RATIO * args.schedule_conservativeness, 1.0),
                "sglang:kv_used_tokens": used, "sglang:kv_available_tokens": plan.max_total_num_tokens - used,
            }
            per_dp[d]["sglang:full_token_usage"] = per_dp[d]["sglang:token_usage"]
        out = []
        for gauge in SCHEDULER_GAUGES if self.release == "0.5.10" else SCHEDULER_GAUGES_0_5_23:
            name, help_ = gauge[0], gauge[1]
            samples = []
            for labels, dp, pid in self.schedulers:
                sample_labels = {**labels, "pid": str(pid)} if len(gauge) > 2 else labels
                samples.append((name, sample_labels, float(per_dp[dp].get(name, 0.0))))
            out.append((name, "gauge", help_, samples))
        for name, help_ in ROUTING_KEY_GAUGES:
            bounds = [0, *ROUTING_KEY_BOUNDS]
            pairs = [(str(bounds[i]), str(bounds[i + 1])) for i in range(len(ROUTING_KEY_BOUNDS))]
            pairs.append((str(ROUTING_KEY_BOUNDS[-1]), "+Inf"))
            out.append((name, "gauge", help_, [(name, {**labels, "gt": gt, "le": le}, 0.0)
                                               for labels, _, _ in self.schedulers for gt, le in pairs]))
        if self.release == "0.5.10":
            pages = plan.max_total_num_tokens // max(1, args.page_size)
            out.append((CACHE_CONFIG_INFO[0], "gauge", CACHE_CONFIG_INFO[1],
                        [(CACHE_CONFIG_INFO[0], {"page_size": str(args.page_size), "num_pages": str(pages)}, 1.0)]))
        return out

    def render(self, accept: str | None, accept_encoding: str | None) -> tuple[bytes, dict[str, str]]:
        """The body and headers prometheus_client's ASGI app answers with (_bake_output)."""
        openmetrics, ctype, escaping = choose_encoder(accept)
        body = (render_openmetrics if openmetrics else render_text)(self.families(), escaping).encode()
        headers = {"content-type": ctype}
        if any(a.split(";")[0].strip().lower() == "gzip" for a in (accept_encoding or "").split(",")):
            body = gzip.compress(body)
            headers["content-encoding"] = "gzip"
        return body, headers


def choose_encoder(accept: str | None) -> tuple[bool, str, str]:
    """prometheus_client.exposition.choose_encoder: (OpenMetrics?, content type, name escaping). Its first
    acceptable entry wins, whatever the q values."""
    for accepted in (accept or "").split(","):
        toks = accepted.split(";")
        kind = toks[0].strip()
        params = dict(t.strip().split("=", 1) for t in toks[1:] if "=" in t)
        escaping = params.get("escaping", UNDERSCORES)
        escaping = escaping if escaping in ESCAPINGS else UNDERSCORES
        version = params.get("version", "")
        if kind == "application/openmetrics-text":
            if not version:
                return True, OPENMETRICS, UNDERSCORES
            if _version(version) >= (1, 0, 0):
                return (True, f"application/openmetrics-text; version={version}; charset=utf-8; escaping={escaping}",
                        escaping)
        elif kind == "text/plain" and version and _version(version) >= (1, 0, 0):
            return False, f"{PLAIN_1_0_0}; escaping={escaping}", escaping
    return False, PLAIN_0_0_4, UNDERSCORES


def _version(text: str) -> tuple[int, ...]:
    """prometheus_client.utils.parse_version."""
    out = []
    for part in text.split("."):
        try:
            out.append(int(part))
        except ValueError:
            out.append(0)
    return tuple(out)


# --- prometheus_client 0.26's name escaping (openmetrics/exposition.py) and writers -----------------------------
# An OpenMetrics sample line escapes its name with the label-name character set, so with escaping=underscores (what
# a Prometheus 2 scrape negotiates: it sends no escaping parameter) sglang:token_usage's samples are written
# sglang_token_usage under "# TYPE sglang:token_usage gauge" (prometheus/client_python#1177). SGLang 0.5.10
# answers so, and so does the simulator.

def _rune(b: str, i: int, metric: bool) -> bool:
    return "a" <= b <= "z" or "A" <= b <= "Z" or b == "_" or ("0" <= b <= "9" and i > 0) or (metric and b == ":")


def _escape(s: str, escaping: str, metric: bool) -> str:
    if escaping == ALLOWUTF8:
        return _escape_value(s)
    out = ["U__"] if escaping == VALUES else []
    for i, b in enumerate(s):
        if escaping == UNDERSCORES:
            out.append(b if _rune(b, i, metric) else "_")
        elif b == "_":
            out.append("__")
        elif escaping == DOTS and b == ".":
            out.append("_dot_")
        elif _rune(b, i, metric):
            out.append(b)
        else:
            out.append("__" if escaping == DOTS else f"_{ord(b):x}_")
    return "".join(out)


def _legacy(s: str, metric: bool) -> bool:
    return bool(s) and all(_rune(b, i, metric) for i, b in enumerate(s))


def escape_metric_name(s: str, escaping: str) -> str:
    if not s:
        return s
    if escaping == ALLOWUTF8:
        return _escape(s, escaping, True) if _legacy(s, True) else f'"{_escape(s, escaping, True)}"'
    if escaping in (UNDERSCORES, VALUES) and _legacy(s, True):
        return s
    return _escape(s, escaping, True)


def escape_label_name(s: str, escaping: str) -> str:
    if not s:
        return s
    if escaping == ALLOWUTF8:
        return _escape(s, escaping, False) if _legacy(s, False) else f'"{_escape(s, escaping, False)}"'
    if escaping in (UNDERSCORES, VALUES) and _legacy(s, False):
        return s
    return _escape(s, escaping, False)


def _labels(labels: dict, escaping: str) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{escape_label_name(k, escaping)}="{_escape_value(str(v))}"'
                          for k, v in sorted(labels.items())) + "}"


def _escape_help(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n")


def _escape_value(v: str) -> str:
    return v.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def render_text(families, escaping: str = UNDERSCORES) -> str:
    """exposition.generate_latest (text format 0.0.4; 1.0.0 with its escaping)."""
    out = []
    for name, kind, help_, samples in families:
        out.append(f"# HELP {escape_metric_name(name, escaping)} {_escape_help(help_)}\n")
        out.append(f"# TYPE {escape_metric_name(name, escaping)} {kind}\n")
        out += [f"{escape_metric_name(s, escaping)}{_labels(labels, escaping)} {go_float(v)}\n"
                for s, labels, v in samples]
    return "".join(out)


def render_openmetrics(families, escaping: str = UNDERSCORES) -> str:
    """openmetrics.exposition.generate_latest: a counter's family is named without _total; # EOF at the end."""
    out = []
    for name, kind, help_, samples in families:
        base = escape_metric_name(name.removesuffix("_total") if kind == "counter" else name, escaping)
        out.append(f"# HELP {base} {_escape_value(help_)}\n")
        out.append(f"# TYPE {base} {kind}\n")
        out += [f"{_escape(s, escaping, False)}{_labels(labels, escaping)} {go_float(v)}\n"
                for s, labels, v in samples]
    out.append("# EOF\n")
    return "".join(out)
