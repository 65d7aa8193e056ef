"""Real SGLang (each supported release, run by driver.py in its oracle venv) judges the product and the simulator.

What the product does for every release it supports (plugins/module_utils/sglang_releases.py), the flags it emits and
refuses and the planner's default, is judged by each release's own code; the simulator, which mimics 0.5.10's
command line and defaults, by 0.5.10.
"""

from __future__ import annotations

import functools

import oracle
import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import answer_check, planner, rollback, sglang_releases

PROFILES = oracle.catalog()["profiles"]
TOLERANCE = 0.002
RELEASES = oracle.env.supported()
# The release whose command line and ServerArgs defaults the simulator (sim/sglang) reproduces.
SIMULATED_RELEASE = "0.5.10"


# --- 1. every flag the product can emit is one SGLang's parser accepts, with the type it expects ------------

def _tunings(name: str, profile: dict, release: str) -> list[dict]:
    """The tunings the rollback can add to this profile on SGLang ``release`` (product code: rollback.next_step)."""
    out = [{}]
    catalog = oracle.catalog()
    for outcome in ({"state": "oom", "phase": "kv_cache"}, {"state": "oom", "phase": "cuda_graph"},
                    {"state": "hung", "phase": "nccl"}):
        attempt = {**rollback.first_attempt(name, profile["nccl"]), "outcome": outcome}
        step = rollback.next_step([name], [attempt], catalog, profile["flags"], release=release)
        if step["action"] == "start" and step["attempt"].get("tuning"):
            out.append(step["attempt"]["tuning"])
    return out


def _service_sources() -> dict[str, dict]:
    defaults = oracle.role_defaults("sglang_service")
    inventory = {**defaults, **oracle.example_inventory_vars()}
    return {"role defaults": defaults, "inventory/example": inventory}


def _emitted(release: str) -> list[tuple[str, dict, list[str]]]:
    """(what, flags, argv) for every profile x service settings x rollback tuning, rendered for ``release``."""
    out = []
    for source, service in _service_sources().items():
        for name, profile in PROFILES.items():
            for tuning in _tunings(name, profile, release):
                flags = {**profile["flags"], **(service.get("sglang_service_extra_flags") or {}), **tuning}
                what = f"{name} with {source}" + (f" and rollback tuning {tuning}" if tuning else "")
                out.append((what, {**_head(service), **oracle.model_flags(service),
                                   **oracle.metrics_flags(service, flags), **flags},
                            oracle.rendered_args(flags, service, release)))
    return out


def _head(service: dict) -> dict:
    return {"model_path": service["sglang_model_path"],
            "served_model_name": service["sglang_service_served_model_name"],
            "host": service["sglang_service_host"], "port": service["sglang_service_port"]}


@pytest.mark.parametrize("release", RELEASES)
def test_every_emitted_flag_is_accepted_with_its_type(release):
    emitted = _emitted(release)
    seen = [tuning for name, p in PROFILES.items() for tuning in _tunings(name, p, release)]
    assert any(seen), "no rollback tuning seen"
    answers = oracle.ask([{"op": "parse", "argv": argv} for _, _, argv in emitted], release)
    problems = []
    for (what, flags, argv), answer in zip(emitted, answers, strict=True):
        if not answer["accepted"]:
            problems.append(f"{what}: SGLang {release} rejects {' '.join(argv)}: {answer['error']}")
            continue
        # each flag under the name the release gives it (0.5.23: cuda_graph_max_bs_decode, attn_dp_size)
        for key, value in sglang_releases.spelled_for(flags, release).items():
            if value is None or value is False:
                continue
            if key not in answer["values"]:
                problems.append(f"{what}: {key} does not reach ServerArgs.{key} (parsed: {sorted(answer['values'])})")
                continue
            parsed = answer["values"][key]
            same_type = type(value).__name__ == answer["types"][key] or (
                isinstance(value, int) and not isinstance(value, bool) and answer["types"][key] == "float")
            if parsed != value or not same_type:
                problems.append(f"{what}: {key}={value!r} ({type(value).__name__}) is parsed by SGLang {release} "
                                f"as {parsed!r} ({answer['types'][key]})")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("release", RELEASES)
def test_parser_rejects_what_sglang_rejects(release):
    """The judge can say no: a kv-cache dtype SGLang does not know, and a flag it does not have."""
    bad = [["--model-path", "/m", "--kv-cache-dtype", "fp8"], ["--model-path", "/m", "--tp-size", "eight"],
           ["--model-path", "/m", "--expert-groups", "4"]]
    answers = oracle.ask([{"op": "parse", "argv": argv} for argv in bad], release)
    assert [a["accepted"] for a in answers] == [False, False, False]
    assert "invalid choice: 'fp8'" in answers[0]["error"]
    assert "invalid int value: 'eight'" in answers[1]["error"]
    assert "unrecognized arguments: --expert-groups 4" in answers[2]["error"]


@pytest.mark.parametrize("release", RELEASES)
def test_the_controllers_flag_data_is_the_wheels_parser(release):
    """plugins/module_utils/sglang_args_<release>.py (what the controller judges sglang_service_extra_flags by for
    that release) is what that SGLang's parser says today; regenerate it with tests/oracle/server_args_data.py."""
    import server_args_data  # noqa: PLC0415  (tests/oracle)

    target = server_args_data.target(release)
    assert target.exists(), f"{target.name} is missing: run .venv/bin/python tests/oracle/server_args_data.py {release}"
    assert target.read_text() == server_args_data.current(release), (
        f"{target.name} is out of date: run .venv/bin/python tests/oracle/server_args_data.py {release}")


# Flags of both kinds, as an operator writes them in sglang_service_extra_flags: the controller's verdict must be
# real SGLang's parser's (layout and role-owned flags, which SGLang takes but a profile or a role variable owns,
# and ranges argparse does not check, are judged in tests/unit/test_extra_flags.py).
PARSER_CASES = [
    {"kv_cache_dtype": "fp8"}, {"kv_cache_dtype": "fp8_e4m3"}, {"mem_fraction_statc": 0.8},
    {"max_running_requests": "many"}, {"max_running_requests": 64}, {"context_length": "128k"},
    {"context_length": "1.5Ki"}, {"tool_call_parser": "kimi-k2"}, {"tool_call_parser": "kimi_k2"},
    {"reasoning_parser": "kimi_k2"}, {"cuda_graph_bs": [1, 2, "x"]}, {"cuda_graph_bs": [1, 2, 4]},
    {"enable_metrics": True}, {"attention_backend": "nope"}, {"json_model_override_args": {"a": 1}},
]


@pytest.mark.parametrize("release", RELEASES)
def test_the_controller_refuses_exactly_what_sglangs_parser_refuses(release):
    from ansible_collections.moefleet.serving.plugins.module_utils import profiles  # noqa: PLC0415
    from ansible_collections.moefleet.serving.plugins.module_utils.extra_flags import (  # noqa: PLC0415
        OWNED,
        extra_flag_problems,
        value_problem,
    )

    def ours(flags: dict) -> list[str]:
        """The controller's judgement of the values: a flag a role variable owns (the parsers, the context length)
        is refused in sglang_service_extra_flags for that reason, and its value judged where the variable is
        (profiles.served_model_problems, through the same value_problem)."""
        found = [p for p in extra_flag_problems("sglang_service_extra_flags", flags, release)
                 if "is set by the role" not in p]
        return found + [p for k, v in flags.items() if k in OWNED and (p := value_problem(k, v, release))]

    argvs = [["--model-path", "/m", *profiles.sglang_args({"flags": flags}, release)] for flags in PARSER_CASES]
    answers = oracle.ask([{"op": "parse", "argv": argv} for argv in argvs], release)
    disagree = [(argv, real["error"], found) for argv, real, found in zip(
        argvs, answers, (ours(f) for f in PARSER_CASES), strict=True)
        if real["accepted"] != (found == [])]
    assert not disagree, disagree
    assert sum(not a["accepted"] for a in answers) >= 6, "the cases include flags SGLang refuses"


@pytest.mark.parametrize("release", RELEASES)
def test_what_readiness_expects_is_what_sglang_reports(release):
    """The arguments the readiness check compares with /server_info (roles/sglang_service/tasks/start.yml: the
    model's, metrics' and profile's flags and the served name, spelled for the release by the release_flags filter)
    are each reported by the release's resolved ServerArgs with the value moefleet meant, for every profile: on
    0.5.23, --attn-dp-size is reported as attn_dp_size (dp_size 1) and --cuda-graph-max-bs-decode as itself."""
    service = oracle.role_defaults("sglang_service")
    cases = []
    for name, profile in PROFILES.items():
        flags = {**profile["flags"], **(service.get("sglang_service_extra_flags") or {})}
        expected = sglang_releases.spelled_for(
            {**oracle.model_flags(service), **oracle.metrics_flags(service, flags), **flags,
             "served_model_name": service["sglang_service_served_model_name"]}, release)
        cases.append((name, expected, oracle.rendered_args(flags, service, release)))
    answers = oracle.ask([{"op": "server_args", "model_config": oracle.model_config(), "argv": argv}
                          for _, _, argv in cases], release)
    problems = []
    for (name, expected, _), answer in zip(cases, answers, strict=True):
        assert answer["ok"], f"real SGLang {release} refuses {name}: {answer['error']}"
        reported = answer["server_args"]
        for key, want in expected.items():
            got = reported.get(key, "<not reported>")
            same = got == pytest.approx(want) if isinstance(want, float) else got == want
            if not same:
                problems.append(f"{name} on {release}: readiness expects {key}={want!r}, SGLang reports {got!r}")
    assert not problems, "\n".join(problems)


# --- 2. the planner's default mem_fraction_static is SGLang's ------------------------------------------------

CONFIGS = {
    "kimi-k2.6 (vt_* keys)": oracle.model_config,
    "kimi-k2.6 with plain num_hidden_layers/hidden_size": oracle.k26_plain_vision_config,
    "deepseek-v3 (text only)": functools.partial(oracle.model_config, oracle.DSV3_CONFIG),
}
CASES = [(c, p) for c in CONFIGS for p in PROFILES]


@functools.cache
def _real_server_args(release: str) -> dict:
    service = oracle.role_defaults("sglang_service")
    requests = [{"op": "server_args", "model_config": CONFIGS[c](),
                 "argv": oracle.rendered_args(oracle.without_mem_fraction(PROFILES[p]["flags"]), service, release)}
                for c, p in CASES]
    return dict(zip(CASES, oracle.ask(requests, release), strict=True))


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(("config", "profile"), CASES, ids=[f"{c}-{p}" for c, p in CASES])
def test_planner_default_mem_fraction_is_sglangs(config, profile, release):
    answer = _real_server_args(release)[(config, profile)]
    assert answer["ok"], f"real SGLang {release} refuses {profile} on {config}: {answer['error']}"
    real = answer["server_args"]["mem_fraction_static"]
    flags = oracle.without_mem_fraction(PROFILES[profile]["flags"])
    planned = planner.plan(CONFIGS[config](), oracle.GPUS, oracle.GPU_MEMORY_GIB, flags,
                           smi_memory_mib=oracle.SMI_MEMORY_MIB, release=release).mem_fraction_static
    assert planned == pytest.approx(real, abs=TOLERANCE), (
        f"{profile} on {config}: the planner assumes SGLang {release}'s default --mem-fraction-static is "
        f"{planned:.4f}, real SGLang {release} computes {real:.4f}")


@pytest.mark.parametrize("release", RELEASES)
def test_the_vision_tower_changes_sglangs_default(release):
    """The three configs really differ in SGLang's eyes, so the planner test cannot pass by accident."""
    by_config = {c: _real_server_args(release)[(c, "tp8")]["server_args"]["mem_fraction_static"] for c in CONFIGS}
    assert len({round(v, 4) for v in by_config.values()}) == 3, by_config


# --- 3. the simulator parses and defaults as real ServerArgs does --------------------------------------------

COMPARED = ["tp_size", "pp_size", "ep_size", "dp_size", "enable_dp_attention", "mem_fraction_static",
            "chunked_prefill_size", "cuda_graph_max_bs", "kv_cache_dtype", "moe_a2a_backend"]


@functools.cache
def _real_for_profiles() -> dict:
    service = oracle.role_defaults("sglang_service")
    requests = [{"op": "server_args", "model_config": oracle.model_config(oracle.SIM_K26_CONFIG),
                 "argv": oracle.rendered_args(PROFILES[p]["flags"], service, SIMULATED_RELEASE)} for p in PROFILES]
    return dict(zip(PROFILES, oracle.ask(requests, SIMULATED_RELEASE), strict=True))


def _differences(real: dict, seen: dict, where: str) -> list[str]:
    out = []
    for key in COMPARED:
        want, got = real.get(key), seen.get(key, "<missing>")
        same = (got == pytest.approx(want, abs=TOLERANCE)) if isinstance(want, float) else got == want
        if not same:
            out.append(f"{where} {key}: simulator {got!r}, real SGLang {want!r}")
    return out


@pytest.mark.parametrize("profile", list(PROFILES))
def test_simulator_server_args_are_sglangs(profile):
    answer = _real_for_profiles()[profile]
    assert answer["ok"], f"real SGLang refuses {profile}: {answer['error']}"
    real = answer["server_args"]
    sim = oracle.run_simulator(oracle.rendered_args(PROFILES[profile]["flags"], oracle.role_defaults("sglang_service"),
                                                    SIMULATED_RELEASE))
    assert sim["server_args_line"], f"the simulator printed no server_args= line:\n{sim['log']}"
    problems = _differences(real, oracle.parse_server_args_line(sim["server_args_line"]), "server_args=")
    if sim["server_info"] is not None:
        problems += _differences(real, sim["server_info"], "/server_info")
    assert not problems, f"{profile}:\n" + "\n".join(problems)
    # served with the role's defaults (Kimi K2.6's parsers), every check of the correctness gate passes
    assert (real["tool_call_parser"], real["reasoning_parser"]) == ("kimi_k2", "kimi_k2")
    assert sim["answers"] == {check: None for check in answer_check.CHECKS}, sim["answers"]
