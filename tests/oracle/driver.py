"""Runs real SGLang (the release of the oracle venv it runs in) and answers in JSON; see tests/oracle/README.md.

Run with an oracle venv's python: ``driver.py < requests.json > answers.json``. The input is a JSON list
of requests, the output the list of answers, in order (``driver.py --serve``: one such list per line, for as many
lines as come, each answered on a line of its own):

- ``{"op": "parse", "argv": [...]}``: SGLang's own parser (``ServerArgs.add_cli_args``, and
  ``ConfigArgumentMerger`` for ``--config``, as ``prepare_server_args`` does) on the argv.
  Answer: ``{"accepted": bool, "error": text or null, "values": {field: value}, "types": {field: type}}``
  for every ServerArgs field, as ``ServerArgs.from_cli_args`` hands them over (before ``__post_init__``, or on
  releases whose ServerArgs is a msgspec record, 0.5.23 on, before ``resolve_once``).
- ``{"op": "arguments"}``: every argument of SGLang's parser as data (``server_args.arguments``).
- ``{"op": "server_args", "argv": [...], "model_config": {...}}``: ``prepare_server_args(argv)``
  with ``--model-path`` (replaced or added) a directory holding that config.json, so every default
  ``ServerArgs.__post_init__`` computes (GPU memory settings, the VLM adjustment through SGLang's own
  model-config classes, parallel sizes) is SGLang's. Answer: ``{"ok": true, "server_args": {field: value}}`` (all of
  ``dataclasses.asdict``, JSON-safe) or ``{"ok": false, "error": "Type: message"}``. On a release whose ServerArgs
  is a msgspec record (0.5.23 on), the defaults are computed by ``resolve_once()`` and the fields are
  ``resolved_dict()``, what that release's ``/server_info`` serves (``cuda_graph_max_bs`` is
  ``cuda_graph_config.decode.max_bs`` there).

- ``{"op": "chat", "request": {...}, "text": raw, "finish_reason": {...}, "reasoning_parser": name or null,
  "tool_call_parser": name or null}``: what ``serving_chat`` makes of a model's raw ``text`` for the chat ``request``
  (validated as SGLang's ``ChatCompletionRequest``), non-streaming: the release's own
  ``OpenAIServingChat._build_chat_response``, compiled from its ``serving_chat.py`` (importing that module needs
  fastapi, which the oracle venv does not install), run for a server started with those parsers. Answer:
  ``{"message": {"content", "reasoning_content", "tool_calls"}, "finish_reason": type}``, the message's fields as
  that release sets them (0.5.23: ``content`` ``""`` where 0.5.10 has null).

- ``{"op": "metric_families", "model_config": {...}}``: every Prometheus family SGLang's collectors define
  (metrics_driver.py; the model config resolves the server arguments 0.5.23's collectors read):
  ``{"ok": true, "families": {name: {"type", "help", "labels", "buckets", "multiprocess_mode", "source",
  "default"}}}``, named as the text format's ``# TYPE`` line names them (a counter with ``_total``).
- ``{"op": "metrics", "argv": [...], "model_config": {...}, "requests": [{"prompt_tokens", "completion_tokens",
  "stream"}], "num_pages": n, "accept": [header, ...]}``: what /metrics answers for a server started with argv
  that served those requests, built by SGLang's own collectors in one process per scheduler and one for the
  tokenizer (metrics_driver.py). Answer: ``{"ok": true, "schedulers": [{ranks, "enabled", "labels"}],
  "answers": {accept: {"content_type", "text"}}}``.
- ``{"op": "auth", "api_key": k, "requests": [[method, path, authorization], ...]}``: utils/auth.py
  ``decide_request_auth`` for each. Answer: ``{"ok": true, "allowed": [bool, ...]}``.
- ``{"op": "parse_metrics", "text": exposition, "openmetrics": bool}``: prometheus_client's own parser on it.
  Answer: ``{"ok": true, "families": {name: {"type", "help", "samples"}}}`` or ``{"ok": false, "error"}``.

Only GPU probing is replaced (``gpu.py``), and for the metrics ops the module that needs CUDA kernels
(metrics_driver.py says which): nothing else of SGLang is touched. The metrics op (not metric_families) reproduces
0.5.10's process layout and collectors only.
"""

from __future__ import annotations
import __future__

import argparse
import contextlib
import dataclasses
import functools
import io
import json
import logging
import os
import sys
import tempfile
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import gpu  # noqa: E402
from argvs import with_value  # noqa: E402
from transformers.utils import import_utils  # noqa: E402

# transformers decides once (cached) whether torchvision exists: it does not here, so its image code stays
# off; only then may SGLang's modules find the names they import (standins/torchvision).
assert not import_utils.is_torchvision_available(), "a real torchvision is installed; drop tests/oracle/standins"
sys.path.insert(1, str(HERE / "standins"))

# SGLang's modules are imported as on any machine without a GPU (CPU code paths, no CUDA kernels), the
# GPU answers go in afterwards: only the probes ServerArgs makes at run time see the Blackwell host.
from sglang.srt.configs import model_config as _model_config  # noqa: E402,F401  (ServerArgs imports it lazily)
from sglang.srt.server_args import ServerArgs, prepare_server_args  # noqa: E402

# 0.5.10's ServerArgs is a dataclass whose __post_init__ computes the defaults; from 0.5.23 on it is a msgspec
# record (arg_groups/) that resolve_once() resolves, through handler modules it imports lazily.
RECORD = not dataclasses.is_dataclass(ServerArgs)
if RECORD:
    import importlib  # noqa: E402
    import pkgutil  # noqa: E402

    from sglang.srt import arg_groups  # noqa: E402

    # Imported now, like the modules above, so they too take their CPU code paths (installing the GPU answers
    # first makes a quantization module reached from them import sgl_kernel).
    for _hook in pkgutil.iter_modules(arg_groups.__path__):
        if _hook.name.endswith("_hook") or _hook.name == "pipeline":
            importlib.import_module(f"sglang.srt.arg_groups.{_hook.name}")

gpu.install()
if RECORD:
    # The platform object is resolved once, on first use; any import above may have resolved it as CPU.
    import sglang.srt.platforms as _platforms  # noqa: E402

    _platforms._current_platform = None

logging.disable(logging.WARNING)


def _jsonable(value):
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return repr(value)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    return parser


def parse(argv: list[str]) -> dict:
    parser = _parser()
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            if "--config" in argv:
                argv = _config_merger()(parser).merge_config_with_args(argv)
            ns = parser.parse_args(argv)
    except SystemExit:
        lines = [line for line in err.getvalue().splitlines() if line.strip()]
        return {"accepted": False, "error": lines[-1] if lines else "argparse exited", "values": {}, "types": {}}
    # ServerArgs' own field names (0.5.10's from_cli_args maps --tp-size's dest tensor_parallel_size to tp_size,
    # ...); the defaults, which need a model, are what the server_args op computes.
    fields = _fields(ServerArgs.from_cli_args(ns)) if RECORD else dataclasses.asdict(_Unchecked.from_cli_args(ns))
    return {"accepted": True, "error": None, "values": _jsonable(fields),
            "types": {name: type(v).__name__ for name, v in fields.items()}}


def _config_merger():
    """``ConfigArgumentMerger``, which ``prepare_server_args`` runs on ``--config`` (moved to utils/ in 0.5.23)."""
    try:
        from sglang.srt.utils.server_args_config_parser import ConfigArgumentMerger
    except ImportError:
        from sglang.srt.server_args_config_parser import ConfigArgumentMerger
    return ConfigArgumentMerger


def _fields(record) -> dict:
    """A msgspec ServerArgs' fields, as the release's own ``record_fields`` lists them."""
    from sglang.srt.arg_groups.arg_utils import record_fields

    return {f.name: getattr(record, f.name) for f in record_fields(type(record))}


if not RECORD:
    class _Unchecked(ServerArgs):
        def __post_init__(self):
            pass


def server_args(argv: list[str], model_config: dict) -> dict:
    with tempfile.TemporaryDirectory(prefix="oracle-model-") as model_dir:
        # A checkpoint's auto_map names remote code (configuration_*.py) that lives on the Hub, not here.
        # SGLang replaces whatever class it loads by its own for the model types it registers
        # (utils/hf_transformers_utils.py get_config, the _CONFIG_REGISTRY branch), so without auto_map
        # transformers loads SGLang's class directly and ServerArgs sees the same object.
        config = {k: v for k, v in model_config.items() if k != "auto_map"}
        Path(model_dir, "config.json").write_text(json.dumps(config))
        full = with_value(argv, "--model-path", model_dir)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                args = prepare_server_args(full)
                if RECORD:
                    args.resolve_once()
        except SystemExit:
            return {"ok": False, "error": "SystemExit: " + err.getvalue().strip().splitlines()[-1]}
        except Exception as exc:  # noqa: BLE001 - SGLang's own refusal is the answer
            return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        fields = args.resolved_dict() if RECORD else {f.name: getattr(args, f.name) for f in dataclasses.fields(args)}
        fields["model_path"] = fields["tokenizer_path"] = "<model dir>"
        return {"ok": True, "server_args": _jsonable(fields)}


def arguments() -> dict:
    """SGLang's parser as data, the shape of ARGUMENTS in plugins/module_utils/sglang_args_<release>.py: for each
    argument, by its name as moefleet writes flags (the first long option without dashes; 0.5.10's first is often
    the long spelling, --tensor-parallel-size, 0.5.23's the short one, --tp-size):
    ``{"options": [...], "kind": "switch" | "value" | "list", "type": "int" | "float" | "str" | "json" | "bool",
    "choices": [...] or null}``."""
    out = {}
    for action in _parser()._actions:
        longs = [o for o in action.option_strings if o.startswith("--")]
        if not longs or action.dest == "help":
            continue
        name = longs[0][2:].replace("-", "_")
        if action.nargs == 0:
            kind, kind_type = "switch", "bool"
        else:
            kind = "list" if action.nargs in ("+", "*") or isinstance(action.nargs, int) else "value"
            kind_type = {int: "int", float: "float", str: "str", None: "str", json.loads: "json"}.get(
                action.type, getattr(action.type, "__name__", repr(action.type)))
        choices = sorted(str(c) for c in action.choices) if action.choices is not None else None
        out[name] = {"options": sorted(action.option_strings), "kind": kind, "type": kind_type, "choices": choices}
    return out


class _Absent:
    """A name serving_chat.py imports from a module the oracle venv cannot import (fastapi, jsonschema, ...): the
    response path does not use it; anything that does fails, naming it."""

    def __init__(self, name: str, why: str):
        self._name, self._why = name, why

    def __getattr__(self, attr):
        raise RuntimeError(f"driver.py: {self._name} is not importable in the oracle venv ({self._why})")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"driver.py: {self._name} is not importable in the oracle venv ({self._why})")


@functools.cache
def _serving_chat() -> type:
    """The release's own ``OpenAIServingChat``, compiled from its serving_chat.py: the module's top level run
    statement by statement (an import the oracle venv cannot satisfy, fastapi above all, leaves its names as
    ``_Absent``), then the class without its base (``OpenAIServingBase``, which needs fastapi). Its
    ``_build_chat_response`` is then the release's whole non-streaming answer: reasoning parser, tool-call parser,
    ids, finish reason and the message as that release builds it."""
    import ast
    import importlib.util

    path = Path(importlib.util.find_spec("sglang").submodule_search_locations[0]) / "srt" / "entrypoints" / \
        "openai" / "serving_chat.py"
    tree = ast.parse(path.read_text())
    namespace: dict = {"__name__": "sglang.srt.entrypoints.openai.serving_chat"}

    def run(node):
        code = compile(ast.Module(body=[node], type_ignores=[]), str(path), "exec",
                       flags=__future__.annotations.compiler_flag, dont_inherit=True)
        exec(code, namespace)  # noqa: S102 - SGLang's own code

    cls = None
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "OpenAIServingChat":
            cls = node
        elif isinstance(node, ast.Import | ast.ImportFrom):
            try:
                run(node)
            except Exception as exc:  # noqa: BLE001 - left absent, see _Absent
                for alias in node.names:
                    name = alias.asname or alias.name.split(".")[0]
                    namespace[name] = _Absent(name, f"{type(exc).__name__}: {exc}")
        else:
            run(node)
    cls.bases, cls.keywords = [], []
    run(cls)
    return namespace["OpenAIServingChat"]


def chat(request: dict) -> dict:
    """``_build_chat_response`` of the release's OpenAIServingChat on the raw text, for a server started with the
    request's parsers. Its template manager forces no reasoning (as K2.6's does not) and detected no reasoning toggle
    (0.5.23's ``reasoning_config`` None: that release then takes the kimi_k2 parser's own default, thinking unless
    ``chat_template_kwargs`` says ``thinking: false``, which is 0.5.10's rule too)."""
    from sglang.srt.entrypoints.openai.protocol import ChatCompletionRequest
    from sglang.srt.parser.reasoning_parser import ReasoningParser

    chat_class = _serving_chat()
    namespace = chat_class._build_chat_response.__globals__
    if "get_serving" in namespace:  # 0.5.23 on: the serving config a server started with its defaults publishes
        serving = types.SimpleNamespace(enable_cache_report=False, return_input_ids=False, return_output_ids=False,
                                        incremental_streaming_output=False)
        namespace["get_serving"] = lambda: serving
    self = object.__new__(chat_class)  # what __init__ sets that the response path reads
    self.reasoning_parser = request.get("reasoning_parser")
    self.tool_call_parser = request.get("tool_call_parser")
    self.template_manager = types.SimpleNamespace(force_reasoning=False, reasoning_config=None)
    self.tokenizer_manager = types.SimpleNamespace(tokenizer=None,
                                                   server_args=types.SimpleNamespace(enable_cache_report=False))
    self.chat_encoding_spec, self._encoding_adapter, self._reasoning_detector = None, None, None
    if self.reasoning_parser:  # 0.5.23's __init__ keeps the parser's detector (its reasoning_default)
        self._reasoning_detector = ReasoningParser(model_type=self.reasoning_parser, stream_reasoning=True).detector
    req = ChatCompletionRequest(**request["request"])
    ret = [{"text": request["text"], "output_ids": [], "meta_info": {
        "id": "chatcmpl-oracle", "finish_reason": dict(request["finish_reason"]), "prompt_tokens": 1,
        "completion_tokens": 1, "weight_version": "default"}}]
    response = self._build_chat_response(req, ret, 0)
    choice = response.choices[0]
    message = choice.message
    calls = None if message.tool_calls is None else [c.model_dump() for c in message.tool_calls]
    return {"message": {"content": message.content, "reasoning_content": message.reasoning_content,
                        "tool_calls": calls}, "finish_reason": choice.finish_reason}


def answer(request: dict) -> dict:
    if request.get("op") == "arguments":
        return arguments()
    if request.get("op") == "parse":
        return parse(list(request["argv"]))
    if request.get("op") == "server_args":
        return server_args(list(request["argv"]), request["model_config"])
    if request.get("op") == "chat":
        return chat(request)
    if request.get("op") in ("metric_families", "metrics", "auth", "parse_metrics"):
        import metrics_driver

        return {"metric_families": metrics_driver.metric_families, "metrics": metrics_driver.exposition,
                "auth": metrics_driver.auth, "parse_metrics": metrics_driver.parse}[request["op"]](request)
    return {"ok": False, "error": f"unknown op {request.get('op')!r}; use parse, arguments, server_args, chat, "
                                  "metric_families, metrics, auth or parse_metrics"}


def main() -> None:
    os.environ.setdefault("SGLANG_DISABLE_REQUEST_LOGGING", "1")
    if sys.argv[1:] == ["--serve"]:
        serve()
        return
    requests = json.load(sys.stdin)
    json.dump([answer(r) for r in requests], sys.stdout)


def serve() -> None:
    """``driver.py --serve``: a JSON list of requests per input line, the list of answers per output line, until the
    input ends. oracle.py keeps one such driver per release for a whole test run, so that SGLang (several seconds
    of CPU to import) is imported once per release rather than once per question. Whatever SGLang prints goes to
    stderr, not into the answers."""
    answers = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout = sys.stderr
    for line in sys.stdin:
        if line.strip():
            answers.write(json.dumps([answer(r) for r in json.loads(line)]) + "\n")
            answers.flush()


if __name__ == "__main__":
    main()
