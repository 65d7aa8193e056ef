"""Real SGLang's Prometheus metrics, for driver.py's ``metric_families``, ``metrics`` and ``auth`` ops (oracle venv).

``metric_families`` builds the collectors of the release it runs in (0.5.10; 0.5.23, whose collectors read the
runtime context's published configuration: see ``_family_server_args``). ``metrics`` reproduces 0.5.10's process
layout and collectors, as described below; 0.5.23 launches its schedulers and builds their collectors otherwise
(entrypoints/engine.py reads the published parallel configuration, ``SchedulerMetricsCollector.init_new``), which is
not reproduced here.

SGLang runs prometheus_client in multiprocess mode: PROMETHEUS_MULTIPROC_DIR is set before prometheus_client is
first imported (utils/common.py set_prometheus_multiproc_dir), each scheduler process and the main process
(TokenizerManager) write their own files, and /metrics is a MultiProcessCollector over them
(add_prometheus_middleware). Here each of those processes is a forked child that builds SGLang's own collectors
the way SGLang does:

- which scheduler processes exist, with which ranks: the launchers' own code, taken from the wheel's source
  (engine.py ``_launch_scheduler_processes`` with dp_size 1, data_parallel_controller.py
  ``launch_tensor_parallel_group`` otherwise), with ``mp.Process`` recording instead of starting;
- what each scheduler registers: ``SchedulerMetricsMixin.init_metrics`` from its source on the scheduler's ranks
  (attn_tp_rank from ``compute_dp_attention_world_info``, as ``Scheduler.__init__`` computes it); a scheduler whose
  ``current_scheduler_metrics_enabled`` is true then logs its stats (log_stats, as report_*_stats and the idle
  check do), and every scheduler emits ``cache_config_info`` (scheduler.py, init_memory_pool);
- the tokenizer: ``TokenizerManager.init_metric_collector_watchdog`` and, per request, ``collect_metrics`` from
  their source, fed the outputs the scheduler sends (scheduler_output_processor_mixin.py: every stream_interval
  tokens when streamed, every DEFAULT_FORCE_STREAM_INTERVAL otherwise, and at the end).

Importing metrics_collector reaches model_executor/forward_batch_info.py, which needs sgl_kernel (CUDA kernels,
not installable here) for ``ForwardMode``; metrics_collector uses it only in DPCooperationInfo.create (DP
cooperation stats of a running batch), so that module is replaced by a stand-in whose ForwardMode fails if called.
"""

from __future__ import annotations
import __future__

import ast
import atexit
import contextlib
import importlib.util
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import threading
import traceback
import types
from pathlib import Path

from argvs import with_value

_ROOT: list[str] = []  # the multiprocess directory's parent, set once before prometheus_client is imported
_PARENT = os.getpid()  # the driver (forked children leave the directory to it)


def _prometheus_dir() -> str:
    """A fresh PROMETHEUS_MULTIPROC_DIR; the first call sets it before prometheus_client is imported."""
    if not _ROOT:
        assert "prometheus_client" not in sys.modules, "prometheus_client imported before PROMETHEUS_MULTIPROC_DIR"
        _ROOT.append(tempfile.mkdtemp(prefix="oracle-prometheus-"))
        root = _ROOT[0]
        atexit.register(lambda: os.getpid() == _PARENT and shutil.rmtree(root, ignore_errors=True))
    path = tempfile.mkdtemp(dir=_ROOT[0])
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = path
    return path


def _sglang_file(rel: str) -> Path:
    return Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt" / rel


def _from_source(rel: str, names: tuple[str, ...], namespace: dict, cls: str | None = None) -> dict:
    """Functions (methods of `cls`, decorators dropped) compiled from the wheel's source into `namespace`."""
    tree = ast.parse(_sglang_file(rel).read_text())
    body = tree.body
    if cls is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls).body
    found = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    assert {n.name for n in found} == set(names), f"{rel}: {set(names) - {n.name for n in found}} not found"
    for node in found:
        node.decorator_list = []
    code = compile(ast.Module(body=found, type_ignores=[]), str(_sglang_file(rel)), "exec",
                   flags=__future__.annotations.compiler_flag, dont_inherit=True)
    exec(code, namespace)  # noqa: S102 - SGLang's own code
    return {name: namespace[name] for name in names}


def _constant(rel: str, name: str):
    tree = ast.parse(_sglang_file(rel).read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and any(
        isinstance(t, ast.Name) and t.id == name for t in n.targets))
    return ast.literal_eval(node.value)


def _collectors():
    """metrics_collector, imported with the forward_batch_info stand-in (see the module's docstring)."""
    name = "sglang.srt.model_executor.forward_batch_info"
    if name not in sys.modules:
        stub = types.ModuleType(name)

        class ForwardMode:  # noqa: D401 - the stand-in
            def __init__(self, *_):
                raise RuntimeError("tests/oracle/metrics_driver.py: ForwardMode is a stand-in (needs sgl_kernel)")

        stub.ForwardMode = ForwardMode
        sys.modules[name] = stub
    from sglang.srt.observability import metrics_collector

    return metrics_collector


def _in_child(fn, *args):
    """fn(*args) in a forked process (a process of its own, as SGLang's are); its JSON-able result."""
    ctx = multiprocessing.get_context("fork")
    reader, writer = ctx.Pipe(duplex=False)

    def run():
        try:
            writer.send(json.dumps({"ok": fn(*args)}))
        except BaseException:  # noqa: BLE001 - reported to the parent
            writer.send(json.dumps({"error": traceback.format_exc()}))

    proc = ctx.Process(target=run)
    proc.start()
    answer = json.loads(reader.recv())
    proc.join()
    if "error" in answer:
        raise RuntimeError(answer["error"])
    return answer["ok"]


# --- which scheduler processes SGLang starts -----------------------------------------------------------------

class _Recorder:
    """multiprocessing as the launchers use it: Pipe() and Process(target, args) that records args on start()."""

    def __init__(self):
        self.started: list[tuple] = []

    def Pipe(self, duplex=True):  # noqa: N802
        reader = types.SimpleNamespace(recv=lambda: {"max_total_num_tokens": 0, "max_req_input_len": 0})
        return reader, None

    def Process(self, target=None, args=(), kwargs=None):  # noqa: N802
        recorder = self
        return types.SimpleNamespace(start=lambda: recorder.started.append(args), pid=0)


def scheduler_processes(server_args) -> list[dict]:
    """Every scheduler SGLang starts for server_args: {tp_rank, pp_rank, moe_ep_rank, dp_rank, attn_tp_rank}."""
    from sglang.srt.layers.dp_attention import compute_dp_attention_world_info

    mp = _Recorder()
    null = types.SimpleNamespace(configure_subprocess=lambda *a, **k: contextlib.nullcontext())
    namespace = {
        "mp": mp, "TorchMemorySaverAdapter": types.SimpleNamespace(create=lambda **_: null), "numa_utils": null,
        "maybe_reindex_device_id": lambda gpu_id: contextlib.nullcontext(gpu_id),
        "compute_dp_attention_world_info": compute_dp_attention_world_info,
        "PortArgs": types.SimpleNamespace(init_new=lambda *a, **k: types.SimpleNamespace(nccl_port=0)),
        "SchedulerInitResult": lambda **kw: kw, "logger": types.SimpleNamespace(info=lambda *a, **k: None),
    }
    if server_args.dp_size == 1:
        fns = _from_source("entrypoints/engine.py", ("_calculate_rank_ranges", "_compute_parallelism_ranks"),
                           namespace)
        namespace.update(fns)
        launch = _from_source("entrypoints/engine.py", ("_launch_scheduler_processes",), namespace, "Engine")
        launch["_launch_scheduler_processes"](None, server_args, types.SimpleNamespace(), None)
    else:
        launch = _from_source("managers/data_parallel_controller.py", ("launch_tensor_parallel_group",), namespace,
                              "DataParallelController")["launch_tensor_parallel_group"]
        controller = types.SimpleNamespace(env_lock=threading.Lock(), scheduler_procs=[],
                                           run_scheduler_process_func=None)
        if server_args.enable_dp_attention:  # launch_dp_attention_schedulers
            launch(controller, server_args, types.SimpleNamespace(nccl_port=0), 0, None,
                   [0] * server_args.dp_size)
        else:  # launch_dp_schedulers: one TP group per DP rank
            base_gpu_id = 0
            for dp_rank in range(server_args.dp_size):
                launch(controller, server_args, types.SimpleNamespace(nccl_port=0), base_gpu_id, dp_rank)
                base_gpu_id += server_args.tp_size * server_args.pp_size * server_args.gpu_id_step
    out = []
    for _, _, gpu_id, tp_rank, _, _, moe_ep_rank, pp_rank, dp_rank, _ in mp.started:
        attn_tp_rank, _, _ = compute_dp_attention_world_info(
            server_args.enable_dp_attention, tp_rank, server_args.tp_size, server_args.dp_size,
            server_args.attn_cp_size)
        out.append({"gpu_id": gpu_id, "tp_rank": tp_rank, "pp_rank": pp_rank, "moe_ep_rank": moe_ep_rank,
                    "dp_rank": dp_rank, "attn_tp_rank": attn_tp_rank})
    return out


# --- one scheduler, one tokenizer ----------------------------------------------------------------------------

def _scheduler(server_args, rank: dict, num_pages: int) -> dict:
    """Scheduler.init_metrics on this rank; stats logged if it reports; cache_config_info emitted."""
    mc = _collectors()
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.environ import envs
    from sglang.srt.utils.scheduler_status_logger import SchedulerStatusLogger

    namespace = {"time": __import__("time"), "defaultdict": __import__("collections").defaultdict,
                 "SchedulerStats": mc.SchedulerStats, "DisaggregationMode": DisaggregationMode,
                 "SchedulerMetricsCollector": mc.SchedulerMetricsCollector, "envs": envs,
                 "ENABLE_METRICS_DEVICE_TIMER": envs.SGLANG_ENABLE_METRICS_DEVICE_TIMER.get(),
                 "SchedulerStatusLogger": SchedulerStatusLogger}
    init_metrics = _from_source("observability/scheduler_metrics_mixin.py", ("init_metrics",), namespace,
                                "SchedulerMetricsMixin")["init_metrics"]
    self = types.SimpleNamespace(
        server_args=server_args, attn_tp_rank=rank["attn_tp_rank"], moe_ep_rank=rank["moe_ep_rank"],
        enable_priority_scheduling=server_args.enable_priority_scheduling, enable_lora=server_args.enable_lora,
        enable_hierarchical_cache=server_args.enable_hierarchical_cache, enable_kv_cache_events=False)
    init_metrics(self, rank["tp_rank"], rank["pp_rank"], rank["dp_rank"])
    if self.current_scheduler_metrics_enabled:
        self.metrics_collector.log_stats(self.stats)
    if self.enable_metrics and hasattr(self, "metrics_collector"):
        self.metrics_collector.emit_cache_config_info(server_args.page_size, num_pages)
    return {"enabled": self.current_scheduler_metrics_enabled,
            "labels": {k: str(v) for k, v in self.metrics_collector.labels.items()}
            if self.current_scheduler_metrics_enabled else None}


def _outputs(n: int, stream: bool, stream_interval: int, force: int) -> list[int]:
    """The token counts at which the scheduler sends a request's output (stream_output, not finished / finished)."""
    out = []
    for length in range(1, n + 1):
        if length == n:
            out.append(length)
        elif stream:
            if (length % stream_interval == 1) if stream_interval > 1 else (length % stream_interval == 0):
                out.append(length)
        elif length % force == 0:
            out.append(length)
    return out or [0]


def _tokenizer(server_args, requests: list[dict]) -> dict:
    """TokenizerManager's collector, and collect_metrics on each request's outputs."""
    mc = _collectors()
    from sglang.srt.disaggregation.utils import DisaggregationMode
    from sglang.srt.environ import envs
    from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread

    namespace = {"TokenizerMetricsCollector": mc.TokenizerMetricsCollector, "envs": envs,
                 "start_cpu_monitor_thread": start_cpu_monitor_thread, "configure_gc_warning": lambda *_: None,
                 "Watchdog": types.SimpleNamespace(create=lambda **_: None), "DisaggregationMode": DisaggregationMode}
    fns = _from_source("managers/tokenizer_manager.py",
                       ("init_metric_collector_watchdog", "collect_metrics", "_request_has_grammar"), namespace,
                       "TokenizerManager")
    self = types.SimpleNamespace(server_args=server_args, enable_metrics=server_args.enable_metrics,
                                 enable_priority_scheduling=server_args.enable_priority_scheduling,
                                 disaggregation_mode=DisaggregationMode(server_args.disaggregation_mode))
    self._request_has_grammar = lambda obj: fns["_request_has_grammar"](self, obj)
    fns["init_metric_collector_watchdog"](self)
    force = _constant("managers/scheduler_output_processor_mixin.py", "DEFAULT_FORCE_STREAM_INTERVAL")
    for req in requests:
        times = types.SimpleNamespace(get_first_token_latency=lambda: 0.5, get_interval=lambda: 0.02,
                                      set_last_time=lambda: None, get_e2e_latency=lambda: 2.0)
        state = types.SimpleNamespace(obj=types.SimpleNamespace(custom_labels=None, priority=None,
                                                                sampling_params={}),
                                      ttft_observed=False, last_completion_tokens=0, finished=False, time_stats=times)
        points = _outputs(req["completion_tokens"], req["stream"], server_args.stream_interval, force)
        for tokens in points:
            state.finished = tokens == points[-1]
            recv = types.SimpleNamespace(completion_tokens=[tokens], prompt_tokens=[req["prompt_tokens"]],
                                         cached_tokens=[0], retraction_counts=[0], cached_tokens_details=None)
            fns["collect_metrics"](self, state, recv, 0)
    return {"labels": dict(self.metrics_collector.labels)}


@contextlib.contextmanager
def _server_args(argv: list[str], model_config: dict):
    from sglang.srt.server_args import prepare_server_args

    with tempfile.TemporaryDirectory(prefix="oracle-model-") as model_dir:
        config = {k: v for k, v in model_config.items() if k != "auto_map"}  # as driver.server_args
        Path(model_dir, "config.json").write_text(json.dumps(config))
        yield prepare_server_args(with_value(argv, "--model-path", model_dir))


def exposition(request: dict) -> dict:
    """The /metrics answers of a server started with request["argv"] that served request["requests"]
    ([{prompt_tokens, completion_tokens, stream}]), for each Accept header in request["accept"]."""
    path = _prometheus_dir()
    _collectors()  # imported once, before the processes fork
    with _server_args(list(request["argv"]), request["model_config"]) as server_args:
        ranks = scheduler_processes(server_args)
        for rank in ranks:
            rank.update(_in_child(_scheduler, server_args, rank, int(request.get("num_pages", 0))))
        tokenizer = _in_child(_tokenizer, server_args, list(request.get("requests") or []))
    from prometheus_client import CollectorRegistry, multiprocess
    from prometheus_client.exposition import choose_encoder

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=path)
    answers = {}
    for accept in request.get("accept") or [""]:
        encoder, content_type = choose_encoder(accept)
        answers[accept] = {"content_type": content_type, "text": encoder(registry).decode()}
    return {"ok": True, "schedulers": ranks, "tokenizer": tokenizer, "answers": answers}


# --- every family, as defined ----------------------------------------------------------------------------------

def _families_of(build) -> dict:
    """The families build() registers in a fresh process: {name in the text format: definition}."""
    import prometheus_client
    from prometheus_client.metrics import MetricWrapperBase

    build()
    out = {}
    for metric in list(prometheus_client.REGISTRY._collector_to_names):  # noqa: SLF001 - the metric objects
        if not isinstance(metric, MetricWrapperBase):
            continue
        name = metric._name + ("_total" if metric._type == "counter" else "")  # noqa: SLF001
        buckets = None
        if metric._type == "histogram":  # noqa: SLF001
            from prometheus_client.utils import floatToGoString

            buckets = [floatToGoString(b) for b in metric._upper_bounds]  # noqa: SLF001
        out[name] = {"type": metric._type, "help": metric._documentation,  # noqa: SLF001
                     "labels": list(metric._labelnames), "buckets": buckets,  # noqa: SLF001
                     "multiprocess_mode": getattr(metric, "_multiprocess_mode", None)}
    return out


def _accepted(fn, **kwargs) -> dict:
    """The keyword arguments ``fn`` takes (a collector's constructor grows and loses some between releases)."""
    import inspect

    params = inspect.signature(fn).parameters
    return {k: v for k, v in kwargs.items() if k in params}


def _scheduler_families(server_args, everything: bool):
    def build():
        mc = _collectors()
        if everything:
            os.environ["SGLANG_ENABLE_EPLB_BALANCEDNESS_METRIC"] = "1"  # 0.5.10; 0.5.23 reads its flag
        labels = {"model_name": "", "engine_type": "", "tp_rank": 0, "pp_rank": 0, "moe_ep_rank": 0}
        mc.SchedulerMetricsCollector(labels=labels, server_args=server_args, **_accepted(
            mc.SchedulerMetricsCollector, enable_lora=everything, enable_hierarchical_cache=everything,
            enable_streaming_session=everything))
    return _families_of(build)


def _tokenizer_families(server_args, everything: bool):
    def build():
        mc = _collectors()
        # 0.5.23's TokenizerManager labels its collector with tokenizer_metric_labels() (engine_type added)
        labels = mc.tokenizer_metric_labels() if hasattr(mc, "tokenizer_metric_labels") else {"model_name": ""}
        mc.TokenizerMetricsCollector(server_args=server_args, labels=labels,
                                     **_accepted(mc.TokenizerMetricsCollector, collect_tokens_histogram=everything))
    return _families_of(build)


def _main_process_families():
    """What the main process adds with --enable-metrics: the HTTP middleware's metrics (0.5.10: the app is a stand-in
    that takes the middleware; 0.5.23: init_http_request_metrics, which http_server's lifespan calls),
    func_latency_seconds (enable_func_timer) and the tokenizer's CPU monitor."""
    def build():
        from sglang.srt.observability.cpu_monitor import start_cpu_monitor_thread
        from sglang.srt.observability.func_timer import enable_func_timer

        try:
            from sglang.srt.utils.common import add_prometheus_track_response_middleware
        except ImportError:
            from sglang.srt.observability.http_request_metrics import init_http_request_metrics
        else:
            def init_http_request_metrics():
                app = types.SimpleNamespace(middleware=lambda kind: (lambda fn: fn),
                                            add_middleware=lambda *a, **k: None)
                add_prometheus_track_response_middleware(app)
        init_http_request_metrics()
        enable_func_timer()
        start_cpu_monitor_thread("tokenizer", interval=3600)
    return _families_of(build)


def _optional_families():
    def build():
        mc = _collectors()
        labels = {"model_name": ""}
        mc.StorageMetricsCollector(labels=labels)
        mc.RadixCacheMetricsCollector(labels=labels)
        mc.ExpertDispatchCollector(ep_size=8)
        if hasattr(mc, "EncoderMetricsCollector"):  # 0.5.23: the encoder servers of disaggregated multimodal
            mc.EncoderMetricsCollector(labels=labels)
    return _families_of(build)


def _family_server_args(model_config: dict | None, everything: bool):
    """The ServerArgs the collectors are built with. 0.5.10's (a dataclass): one without its __post_init__, which
    the collectors only pass along. 0.5.23's (a msgspec record): the collectors read the runtime context's published
    config (get_observability(), get_schedule(), ...), so a server's resolved arguments with --enable-metrics (and,
    for ``everything``, what registers the optional families: --expert-balancedness-report-mode prometheus) are
    published, as the launcher does, before the collectors are built."""
    import dataclasses

    from sglang.srt.server_args import ServerArgs

    if dataclasses.is_dataclass(ServerArgs):
        class _Unchecked(ServerArgs):
            def __post_init__(self):
                pass

        return _Unchecked(model_path="model")
    if model_config is None:
        raise ValueError("metric_families on SGLang 0.5.23 on needs the model_config a server's arguments are "
                         "resolved with (tests/oracle/metrics.py wheel_families sends the simulator's K2.6 config)")
    from sglang.srt.runtime_context import get_context

    argv = ["--model-path", "model", "--enable-metrics"]
    if everything:
        argv += ["--expert-balancedness-report-mode", "prometheus"]
    with _server_args(argv, model_config) as server_args:
        server_args.resolve_once()
    get_context().set_server_args(server_args)
    return server_args


def metric_families(request: dict) -> dict:
    """Every family SGLang's collectors define, by source; ``default``: registered by a server started with plain
    --enable-metrics (others need LoRA, HiCache, --collect-tokens-histogram, an environment variable, ...)."""
    _prometheus_dir()
    _collectors()
    out = {}
    server_args = _family_server_args(request.get("model_config"), True)
    for source, fn, args in (("scheduler", _scheduler_families, (server_args, True)),
                             ("tokenizer", _tokenizer_families, (server_args, True)),
                             ("http_server", _main_process_families, ()),
                             ("optional", _optional_families, ())):
        for name, family in _in_child(fn, *args).items():
            out[name] = {**family, "source": source, "default": source == "http_server"}
    server_args = _family_server_args(request.get("model_config"), False)
    for fn in (_scheduler_families, _tokenizer_families):
        for name in _in_child(fn, server_args, False):
            out[name]["default"] = True
    return {"ok": True, "families": out}


def auth(request: dict) -> dict:
    """utils/auth.py decide_request_auth for each (method, path, authorization) with the server's keys."""
    from sglang.srt.utils.auth import AuthLevel, decide_request_auth

    return {"ok": True, "allowed": [decide_request_auth(
        method=method, path=path, authorization_header=authorization, api_key=request.get("api_key"),
        admin_api_key=request.get("admin_api_key"), auth_level=AuthLevel.NORMAL).allowed
        for method, path, authorization in request["requests"]]}


def parse(request: dict) -> dict:
    """prometheus_client's own parsers on request["text"] (``openmetrics``: the OpenMetrics one, which is strict):
    ``{"ok": true, "families": {name: {"type", "help", "samples": [[name, labels, value]]}}}`` or the parser's
    error."""
    _prometheus_dir()
    if request.get("openmetrics"):
        from prometheus_client.openmetrics.parser import text_string_to_metric_families
    else:
        from prometheus_client.parser import text_string_to_metric_families
    try:
        families = {f.name: {"type": f.type, "help": f.documentation,
                             "samples": [[s.name, dict(s.labels), s.value] for s in f.samples]}
                    for f in text_string_to_metric_families(request["text"])}
    except Exception as exc:  # noqa: BLE001 - the parser's refusal is the answer
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    return {"ok": True, "families": families}
