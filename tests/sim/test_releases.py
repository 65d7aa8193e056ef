"""The simulator as each SGLang release it stands in for (sim/sglang/sglang/_sim/release.py): 0.5.10, and 0.5.23
where 0.5.23's code differs (flags, the default memory fraction, start-up lines, /server_info, /v1/loads), and the
faults that apply to one release only (an upgrade that regresses: "slow", "garbage").

The expected texts and figures are real SGLang's: each release's generated argument table
(plugins/module_utils/sglang_args_<release>.py), the parser's own error lines and 0.5.23's resolved fractions as
tests/oracle/driver.py answers them from the wheels (`parse`, `server_args` on the oracle's RTX PRO 6000 host).
"""

from __future__ import annotations

import json
import signal
import tomllib
import urllib.request

import pytest
import yaml
from ansible_collections.moefleet.serving.plugins.module_utils import (
    planner,
    profiles,
    readiness,
    sglang_args_0_5_10,
    sglang_args_0_5_23,
    sglang_log,
    sglang_releases,
)
from ansible_collections.moefleet.serving.plugins.modules.sglang_drained import total_requests
from conftest import K26_CONFIG, ROOT, SIM_SGLANG
from sglang._sim import args as A
from sglang._sim import faults as F
from sglang._sim import model as M
from sglang._sim import plan as P
from sglang._sim import release as R
from sglang._sim.clock import Clock

TABLES = {"0.5.10": sglang_args_0_5_10.ARGUMENTS, "0.5.23": sglang_args_0_5_23.ARGUMENTS}
CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())["profiles"]
K26 = json.loads(K26_CONFIG.read_text())
# DeepSeek-V3's form of the same model: the text config at the top level, a text-only architecture
DSV3 = {**K26["text_config"], "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
SMI_MIB = 97887  # nvidia-smi's memory.total of an RTX PRO 6000, what SGLang sizes its defaults from


@pytest.fixture
def as_release(monkeypatch):
    """Run this process's simulator code as a release (SGLANG_SIM_RELEASE, read once per process otherwise)."""
    def use(release: str) -> None:
        monkeypatch.setenv("SGLANG_SIM_RELEASE", release)
        R.current.cache_clear()
    yield use
    R.current.cache_clear()


# --- which release ------------------------------------------------------------------------------------------------

def test_the_simulator_is_the_releases_moefleet_supports_and_runs_as_the_roles_pin():
    """The mirror builds a wheel per release pyproject.toml lists; those are the releases the simulator has behaviour
    for and the ones the controller supports; the source tree runs as the release the roles pin."""
    project = tomllib.loads((SIM_SGLANG / "pyproject.toml").read_text())
    assert project["tool"]["moefleet-sim"]["releases"] == list(R.RELEASES) == list(sglang_releases.SUPPORTED)
    defaults = yaml.safe_load((ROOT / "roles" / "moefleet_defaults" / "defaults" / "main.yml").read_text())
    assert project["project"]["version"].split("+")[0] == sglang_releases.release_of(defaults["sglang_package_spec"])


def test_the_release_comes_from_the_source_tree_or_the_sim_only_variable(as_release, monkeypatch):
    monkeypatch.delenv("SGLANG_SIM_RELEASE", raising=False)
    R.current.cache_clear()
    assert R.current() == "0.5.10"
    as_release("0.5.23")
    assert R.current() == "0.5.23"
    as_release("0.5.99")
    with pytest.raises(R.UnknownRelease, match=r"SGLANG_SIM_RELEASE \('0.5.99'\) names SGLang 0.5.99, which the "
                                               r"simulator cannot be; it simulates 0.5.10, 0.5.23\."):
        R.current()


def test_a_server_asked_to_be_an_unknown_release_says_so(lab):
    srv = lab.start("--tp-size", "8", release="0.5.99")
    assert srv.wait_exit() == 1
    assert srv.log.strip().splitlines()[-1] == (
        "sglang (moefleet simulator): SGLANG_SIM_RELEASE ('0.5.99') names SGLang 0.5.99, which the simulator cannot "
        "be; it simulates 0.5.10, 0.5.23.")


# --- flags --------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("release", R.RELEASES)
def test_every_flag_the_simulator_takes_is_one_of_the_releases_parser(release):
    """Each spelling, kind, converter and choice the simulator's parser takes as ``release`` is that release's (its
    generated table): a flag the release lacks fails here."""
    table = {option: spec for spec in TABLES[release].values() for option in spec[3]}
    problems = []
    for action in A.build_parser(release)._actions:
        for option in action.option_strings:
            if option in ("-h", "--help"):
                continue
            if option not in table:
                problems.append(f"{option} is not an option of SGLang {release}")
                continue
            kind, converter, choices, _ = table[option]
            ours = "switch" if action.nargs == 0 else "list" if action.nargs in ("+", "*") else "value"
            if ours != kind:
                problems.append(f"{option} is a {ours} here, a {kind} in SGLang {release}")
            converts = getattr(action.type, "__name__", "str")  # a str-typed flag may be SGLang's own converter's
            if (converts != "str" or converter in ("int", "float")) and converts != converter:
                problems.append(f"{option} converts with {converts} here, {converter} in SGLang {release}")
            extra = set(action.choices or ()) - set(choices or action.choices or ())
            if extra:
                problems.append(f"{option} takes {sorted(extra)} here, which SGLang {release} refuses")
    assert not problems, "\n".join(problems)


# Real SGLang's last stderr line for each (its parser through tests/oracle/driver.py `parse`): 0.5.23 split the CUDA
# graph flags by phase, dropped --enable-nan-detection and the piecewise graphs; 0.5.10 has none of the new flags.
REFUSED = [
    ("0.5.23", ["--cuda-graph-max-bs", "64"], "sglang serve: error: ambiguous option: --cuda-graph-max-bs could match "
                                              "--cuda-graph-max-bs-decode, --cuda-graph-max-bs-prefill"),
    ("0.5.23", ["--cuda-graph-bs", "1", "2"], "sglang serve: error: ambiguous option: --cuda-graph-bs could match "
                                              "--cuda-graph-bs-decode, --cuda-graph-bs-prefill"),
    ("0.5.23", ["--enable-nan-detection"], "sglang serve: error: unrecognized arguments: --enable-nan-detection"),
    ("0.5.23", ["--disable-piecewise-cuda-graph"],
     "sglang serve: error: unrecognized arguments: --disable-piecewise-cuda-graph"),
    ("0.5.10", ["--cuda-graph-max-bs-decode", "8"],
     "sglang serve: error: unrecognized arguments: --cuda-graph-max-bs-decode 8"),
    ("0.5.10", ["--attn-dp-size", "8"], "sglang serve: error: unrecognized arguments: --attn-dp-size 8"),
    ("0.5.10", ["--enable-ep-moe"], "sglang serve: error: unrecognized arguments: --enable-ep-moe"),
    ("0.5.23", ["--pp", "8"], "sglang serve: error: ambiguous option: --pp could match --pp-size, "
                              "--pp-max-micro-batch-size, --pp-async-batch-depth"),
]


@pytest.mark.parametrize(("release", "argv", "error"), REFUSED)
def test_a_flag_the_release_lacks_is_refused_as_its_parser_does(release, argv, error, capsys):
    with pytest.raises(SystemExit) as exited:
        A.parse_args(["--model-path", "m", *argv], release)
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == error


def test_the_0_5_23_server_refuses_0_5_10s_cuda_graph_flag(lab):
    srv = lab.start("--tp-size", "8", "--cuda-graph-max-bs", "64", release="0.5.23")
    assert srv.wait_exit() == 2
    assert srv.log.strip().splitlines()[-1] == REFUSED[0][2]


@pytest.mark.parametrize("release", R.RELEASES)
def test_every_flag_the_roles_write_parses(release):
    """Every catalog profile, with the model's and metrics' flags and the retunes' (a halved CUDA-graph batch, half
    the running requests), as the role spells it for the release (profiles.sglang_args)."""
    extra = {"tool_call_parser": "kimi_k2", "reasoning_parser": "kimi_k2", "sampling_defaults": "model",
             "enable_metrics": True, "enable_metrics_for_all_schedulers": True, "served_model_name": "kimi-k2.6",
             "host": "127.0.0.1", "port": 30000, "cuda_graph_max_bs": 32, "max_running_requests": 1024}
    for name, profile in CATALOG.items():
        argv = profiles.sglang_args({"flags": {"model_path": "/m", **profile["flags"], **extra}}, release)
        args = A.parse_args(argv, release)
        assert (args.tp_size, args.cuda_graph_max_bs, args.max_running_requests) == \
            (profile["flags"]["tp_size"], 32, 1024), name


def test_0_5_23_rewrites_the_deprecated_dp_attention_spelling(capsys):
    """--dp-size N --enable-dp-attention is attn_dp_size N, dp_size 1 (arg_groups/parallel_hook.py), with the
    deprecation warning; --attn-dp-size N alone is the same layout."""
    old = A.parse_args(["--model-path", "m", "--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"], "0.5.23")
    assert "'--enable-dp-attention' is deprecated and will be removed in a future release. Use '--attn-dp-size " \
           "<dp-size>' instead." in capsys.readouterr().err
    new = A.parse_args(["--model-path", "m", "--tp-size", "8", "--attn-dp-size", "8"], "0.5.23")
    for args in (old, new):
        assert args.reported == {"attn_dp_size": 8, "dp_size": 1, "enable_dp_attention": True}
        assert (args.dp_size, args.enable_dp_attention) == (8, True)  # the simulator's layout
    both = A.parse_args(["--model-path", "m", "--tp-size", "8", "--dp-size", "2", "--attn-dp-size", "4"], "0.5.23")
    assert both.dp_conflict == ("--dp-size 2 with --attn-dp-size 4: data-parallel replicas combined with attention "
                                "data parallelism are not supported.")


# --- the default memory fraction ----------------------------------------------------------------------------------

LAYOUTS = [{"tp_size": 8}, {"tp_size": 8, "ep_size": 8}, {"tp_size": 8, "dp_size": 8, "enable_dp_attention": True},
           {"tp_size": 1, "pp_size": 8}, {"tp_size": 4}, {"tp_size": 2, "pp_size": 4},
           {"tp_size": 8, "cuda_graph_max_bs": 64}, {"tp_size": 8, "ep_size": 8, "dp_size": 8,
                                                      "enable_dp_attention": True, "cuda_graph_max_bs": 64}]


def sim_default_fraction(flags: dict, config: dict, release: str) -> float:
    args = A.parse_args(profiles.sglang_args({"flags": {"model_path": "m", **flags}}, release), release)
    P.default_mem_settings(args, M.parse_config(config), SMI_MIB)
    return args.mem_fraction_static


@pytest.mark.parametrize("release", R.RELEASES)
@pytest.mark.parametrize("config", [K26, DSV3], ids=["K2.6", "DeepSeek-V3"])
def test_the_default_fraction_is_the_planners_for_the_release(release, config):
    """The simulator's own arithmetic (plan.py) and the controller's (planner.default_mem_fraction_static), each for
    the release: 0.5.23 keeps the prefill graph's 1.5 GiB for K2.6 and with DP attention, sizes DP attention by
    attn_dp_size, and reserves nothing for a decode graph it does not capture."""
    shape = planner.model_shape(config)
    for flags in LAYOUTS:
        want = planner.default_mem_fraction_static(SMI_MIB, planner.Layout.from_flags(flags), shape.vision, release,
                                                   shape.architecture)
        assert sim_default_fraction(flags, config, release) == pytest.approx(want, abs=1e-12), flags


@pytest.mark.parametrize(("config", "argv", "want"), [
    (K26, ["--tp-size", "8"], 0.757810361328125),
    (K26, ["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"], 0.5858701953125),
    (DSV3, ["--tp-size", "8"], 0.833),
    (DSV3, ["--tp-size", "8", "--dp-size", "8", "--enable-dp-attention"], 0.644),
    (DSV3, ["--tp-size", "8", "--disable-cuda-graph"], 0.859),
    (DSV3, ["--tp-size", "8", "--max-running-requests", "64"], 0.842),
    (DSV3, ["--pp-size", "8"], 0.854),
], ids=["k26-tp8", "k26-dpa", "dsv3-tp8", "dsv3-dpa", "dsv3-no-graphs", "dsv3-64-requests", "dsv3-pp8"])
def test_the_0_5_23_default_fraction_is_real_0_5_23s(config, argv, want):
    """Real 0.5.23's resolution of these (its mem_fraction_static as resolve_once() leaves it)."""
    args = A.parse_args(["--model-path", "m", *argv], "0.5.23")
    P.default_mem_settings(args, M.parse_config(config), SMI_MIB)
    assert args.mem_fraction_static == pytest.approx(want, abs=1e-12)


# --- faults by release ----------------------------------------------------------------------------------------------

def test_a_fault_for_one_release_is_silent_on_the_other(as_release, monkeypatch, capfd):
    monkeypatch.setenv("SGLANG_SIM_FAULTS", json.dumps([
        {"fault": "garbage", "release": "0.5.23"}, {"fault": "slow", "factor": 1.5, "release": ["0.5.23"]},
        {"fault": "crash", "release": 23}]))
    clock = Clock()
    as_release("0.5.10")
    assert F.active_faults(A.parse_args(["--model-path", "m"]), clock) == []
    as_release("0.5.23")
    active = F.active_faults(A.parse_args(["--model-path", "m"]), clock)
    assert [f["fault"] for f in active] == ["garbage", "slow"]
    assert F.slowdown(active, clock) == 1.5
    assert "a fault's \"release\" is a release or a list of them, entry ignored" in capfd.readouterr().err


def generate(srv, prompt: str, tokens: int) -> float:
    """One /generate of exactly ``tokens`` new tokens; the simulated seconds it took (meta_info.e2e_latency)."""
    body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": tokens, "ignore_eos": True}}).encode()
    req = urllib.request.Request(srv.url("/generate"), data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as answer:
        meta = json.loads(answer.read())["meta_info"]
    assert meta["completion_tokens"] == tokens
    return meta["e2e_latency"]


def chat(srv) -> str:
    body = json.dumps({"model": "kimi-k2.6", "messages": [{"role": "user", "content": "What is 2 + 3?"}],
                       "max_tokens": 60, "chat_template_kwargs": {"thinking": False}}).encode()
    req = urllib.request.Request(srv.url("/v1/chat/completions"), data=body,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as answer:
        return json.loads(answer.read())["choices"][0]["message"]["content"]


def test_an_upgrade_to_a_regressed_release_is_slower_and_answers_garbage(lab):
    """The same unit environment (fault list) on both releases: 0.5.10 serves healthily, 0.5.23 answers a run of "!"
    and takes 1.2 times as long for the same prefill and decode, in the simulator's own clock."""
    faults = [{"fault": "slow", "release": "0.5.23"}, {"fault": "garbage", "release": "0.5.23"}]
    # requests in 1/6 of real time: a loaded machine's HTTP and scheduling delays (tens of ms) stay small beside them
    # (at 1.0, 1/60 of real time, the ratio came out 0.97 beside three lab jobs, load average 15)
    env = {"SGLANG_SIM_SERVE_TIME_SCALE": "10"}
    old = lab.start("--tp-size", "8", "--mem-fraction-static", "0.8", faults=faults, env=env, release="0.5.10")
    new = lab.start("--tp-size", "8", "--mem-fraction-static", "0.8", faults=faults, env=env, release="0.5.23")
    old.wait_ready()
    new.wait_ready()
    assert json.loads(old.get("/server_info")[1])["version"] == "0.5.10"
    assert json.loads(new.get("/server_info")[1])["version"] == "0.5.23"
    prompt = "word " * 1600  # 2000 tokens: one prefill chunk
    ratio = generate(new, prompt, 120) / generate(old, prompt, 120)
    assert ratio == pytest.approx(1.2, abs=0.03)
    assert set(chat(new)) == {"!"}
    assert "!" not in chat(old)
    loads = json.loads(old.get("/v1/loads")[1])  # 0.5.10 keeps its aggregate and /get_load
    assert (loads["version"], loads["aggregate"]["total_reqs"], loads["dp_rank_count"]) == ("0.5.10", 0, 1)
    assert old.get("/get_load")[0] == 200
    assert "] Init torch distributed begin.\n" in old.log and "] Capture cuda graph end. Time elapsed: " in old.log


# --- what a 0.5.23 server shows -------------------------------------------------------------------------------------

# LoadSnapshot.to_dict of 0.5.23 (managers/load_snapshot.py): the core fields, then the sections load_inquirer fills
LOAD_KEYS_0_5_23 = {
    "timestamp", "dp_rank", "num_running_reqs", "num_waiting_reqs", "num_waiting_uncached_tokens", "num_used_tokens",
    "num_total_tokens", "num_active_tokens", "num_prealloc_ready_tokens", "max_total_num_tokens",
    "max_running_requests", "token_usage", "gen_throughput", "cache_hit_rate", "utilization",
    "total_prefill_uncached_tokens", "total_prefill_busy_us", "decode_moments", "memory", "disaggregation", "queues"}


def test_the_ep8dpa_profile_serves_on_0_5_23_as_0_5_23_does(lab):
    """The catalog's tightest profile as the role writes it for 0.5.23 (--attn-dp-size, --cuda-graph-max-bs-decode):
    it serves, logs 0.5.23's start-up lines, /server_info reports what readiness expects, /v1/loads has no aggregate
    (the drain sums the ranks) and /get_load is gone."""
    flags = CATALOG["ep8dpa"]["flags"]
    srv = lab.start(*profiles.sglang_args({"flags": {**flags, "served_model_name": "kimi-k2.6"}}, "0.5.23"),
                    release="0.5.23")
    srv.wait_ready()
    log = srv.log
    assert "Init torch distributed" not in log and "server_args=ServerArgs(" not in log
    for text in ("] Init parallel begin.\n", "] Init parallel ends. elapsed=3.00 s\n",
                 "] CustomAllReduceV2 is disabled because it's not supported on more than two PCIe-only GPUs.",
                 "] KV Cache is allocated. dtype: torch.bfloat16, #tokens: ",
                 "] Capture target prefill CUDA graph begin. backend=breakable, num_tokens=[4, 8, 12, ",
                 ", 960, 1024], avail mem=", "] Capture target prefill CUDA graph end. elapsed=",
                 "] Capture target decode CUDA graph begin. backend=full, num_tokens_per_req=1, avail mem=",
                 "] Capture target decode CUDA graph end. bs=[1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64], elapsed=",
                 "] DP attention is enabled. chunked prefill size is adjusted from 8192 to 1024.\n",
                 "] server_args={"):
        assert text in log, text
    status, body = srv.get("/server_info")
    info = json.loads(body)
    assert status == 200 and info["version"] == "0.5.23" and "cuda_graph_max_bs" not in info
    assert (info["attn_dp_size"], info["dp_size"], info["enable_dp_attention"]) == (8, 1, True)
    assert info["cuda_graph_config"]["decode"] == {"backend": "full", "max_bs": 64,
                                                   "bs": [1, 2, 4, 8, 12, 16, 24, 32, 40, 48, 56, 64]}
    expected = sglang_releases.spelled_for({**flags, "served_model_name": "kimi-k2.6"}, "0.5.23")
    assert readiness.compare_server_args(expected, info)["mismatches"] == []
    loads = json.loads(srv.get("/v1/loads")[1])
    assert set(loads) == {"timestamp", "version", "accelerator", "num_accelerators", "loads"}
    assert (loads["version"], loads["accelerator"], loads["num_accelerators"]) == \
        ("0.5.23", "NVIDIA RTX PRO 6000 Blackwell Server Edition", 1)
    assert [entry["dp_rank"] for entry in loads["loads"]] == list(range(8))
    assert all(set(entry) == LOAD_KEYS_0_5_23 for entry in loads["loads"])
    assert total_requests(loads) == 0
    core = json.loads(srv.get("/v1/loads?include=core")[1])["loads"][0]
    assert set(core) == LOAD_KEYS_0_5_23 - {"memory", "disaggregation", "queues"}
    status, body = srv.get("/v1/loads?include=core,bogus")
    assert (status, json.loads(body)["detail"].split(".")[0]) == (400, "Invalid include sections: {'bogus'}")
    assert srv.get("/get_load")[0] == 404


def test_a_cuda_graph_oom_on_0_5_23_is_the_decode_graphs_and_names_its_flags(lab):
    """The oom_cuda_graph fault on 0.5.23: the prefill graph is captured, the decode graph's capture fails with
    0.5.23's text (its flags in the advice), and the controller's log reader sees a CUDA-graph OOM, which the
    rollback retunes with --cuda-graph-max-bs-decode there."""
    srv = lab.start("--tp-size", "8", "--mem-fraction-static", "0.8", faults=[{"fault": "oom_cuda_graph",
                                                                                 "release": "0.5.23"}],
                    release="0.5.23")
    assert srv.wait_exit() == -signal.SIGKILL
    log = srv.log
    assert log.index("Capture target prefill CUDA graph end.") < log.index("Capture target decode CUDA graph begin.")
    assert "Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate" in log
    assert "2. set --cuda-graph-max-bs-decode to a smaller value (e.g., 16)\n" in log
    verdict = sglang_log.classify(log)
    assert (verdict.state, verdict.phase) == ("oom", "cuda_graph")
