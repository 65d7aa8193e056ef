"""Every operator input is checked on the controller: for each variable of each role's meta/argument_specs.yml
(main entry point) and each playbook input, a bad value is refused by the code playbooks/validate.yml runs, before
any host is contacted. A variable added to a spec or to playbook_inputs.INPUTS without a row here fails
test_every_input_has_a_bad_value; one that playbooks/bench.yml starts reading without a row in INPUTS fails
test_every_bench_input_is_documented_declared_and_checked.

The checking code, called as validate.yml calls it: ansible.builtin.validate_argument_spec's validator
(ArgumentSpecValidator) over the role's spec; the moefleet.serving.input_problems filter (booleans `| bool`
misreads, each option's declared type, the RULES table of module_utils/playbook_inputs.py, the catalog's NCCL sets);
module resolve_profiles' host_problems (module_utils/profiles.py: the GPU count, the port, the extra flags, the
served model, the model source), with the roles' defaults under the host's values as validate.yml passes them; and
for the run's own inputs playbook_inputs.problems (the playbook_input_problems filter). The run of validate.yml
itself is tests/integration/test_validate_playbook.py's. The monitoring roles' inputs (node_metrics,
monitoring_server) are checked the same way by playbooks/monitoring.yml's first play, which runs the task file
validate.yml's router play runs (playbooks/tasks/role_inputs.yml); its run is
tests/integration/test_monitoring_inputs_playbook.py's.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from ansible.module_utils.common.arg_spec import ArgumentSpecValidator
from ansible_collections.moefleet.serving.plugins.filter import moefleet as filters
from ansible_collections.moefleet.serving.plugins.module_utils import playbook_inputs, profiles
from role_defaults import role_defaults

ROOT = Path(__file__).resolve().parents[2]
VALIDATE = yaml.safe_load((ROOT / "playbooks" / "validate.yml").read_text())
HOST_PLAY = next(play for play in VALIDATE if play["hosts"] == "blackwell")
ROUTER_PLAY = next(play for play in VALIDATE if play["hosts"] == "routers")
HOST_ROLES = HOST_PLAY["vars"]["moefleet_host_roles"]
ROUTER_ROLES = ROUTER_PLAY["vars"]["moefleet_input_roles"]
HOST_SPEC = HOST_PLAY["vars"]["moefleet_host_inputs_spec"]
CATALOG = yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())
ROLE_INPUTS = "tasks/role_inputs.yml"
MONITORING = yaml.safe_load((ROOT / "playbooks" / "monitoring.yml").read_text())
MONITORING_FILES = yaml.safe_load((ROOT / "playbooks" / "monitoring_files.yml").read_text())
# playbooks/monitoring.yml runs these (node_metrics everywhere, monitoring_server on group monitoring); its first play
# checks their inputs (test_monitoring_yml_checks_its_roles_inputs_first_on_the_controller).
MONITORING_ROLES = ["node_metrics", "monitoring_server"]
# Not the operator's: serve.yml passes the sglang_service role its profile and catalog (validate.yml does too), and
# the playbooks pass router_membership its state.
NOT_CHECKED_BY_VALIDATE = {
    "sglang_service_profile": "serve.yml passes it (-e profile / sglang_profile, checked by resolve_profiles)",
    "sglang_service_catalog": "serve.yml passes it (the catalog validate.yml validated)",
    "router_membership_state": "the playbooks pass it (out/in)",
}
# variable -> (a bad value, a piece of the sentence that refuses it)
BAD: dict[str, tuple[object, str]] = {
    # moefleet_common
    "moefleet_libexec_dir": ("usr/local/libexec", "set it to an absolute path"),
    "moefleet_lib_dir": ("/usr/../lib", "set it to an absolute path"),
    "moefleet_health_facts_file": ({"a": 1}, "not text"),
    "moefleet_unfit_file": ("unfit", "set it to an absolute path"),
    # nvidia_driver
    "nvidia_driver_branch": (550, "from 570 to 999"),
    "nvidia_driver_package": ("nvidia open", "a Debian package name"),
    "nvidia_driver_repo_distro": ("debian 12", "NVIDIA's repository name"),
    "nvidia_driver_repo_url": ("ftp://mirror/", "http:// or https:// URL"),
    "nvidia_driver_repo_key_url": ("", "http:// or https:// URL"),
    "nvidia_driver_kernel_headers": ("maybe", "not a valid boolean"),
    "nvidia_driver_kernel_release": ("6.1 amd64", "a kernel release"),
    "nvidia_driver_kernel_headers_metapackage": ("Linux Headers", "a Debian package name"),
    "nvidia_driver_mok_enrolled": ("y", "which is not a boolean"),
    "nvidia_driver_update_initramfs": ("sometimes", "not a valid boolean"),
    "nvidia_driver_reboot": ("t", "which is not a boolean"),
    "nvidia_driver_reboot_timeout": (0, "from 1 to 86400"),
    "nvidia_driver_check_kernel_module": ("maybe", "not a valid boolean"),
    "nvidia_driver_expected_gpu_count": (0, "set it to a whole number from 1 to 64"),
    "nvidia_driver_expected_gpu_name": ("", "the GPU's name"),
    "nvidia_driver_expected_compute_cap": (12.0, "not text"),
    # cuda_toolkit
    "cuda_toolkit_version": (12.1, "not text"),
    "cuda_toolkit_package": ("cuda toolkit", "a Debian package name"),
    "cuda_toolkit_home": ("cuda", "set it to an absolute path"),
    "cuda_toolkit_env_file": ("default/cuda", "set it to an absolute path"),
    "cuda_toolkit_profile_file": (["/etc/profile.d/x"], "not text"),
    # sglang
    "sglang_user": ("SGLang User", "a user or group name"),
    "sglang_group": ("", "a user or group name"),
    "sglang_device_groups": (["video", "Render Group"], "a list of group names"),
    "sglang_home": ("~sglang", "set it to an absolute path"),
    "sglang_build_packages": (["build essential"], "a list of Debian package names"),
    "sglang_venv": ("venv", "set it to an absolute path"),
    "sglang_venvs_dir": ("opt/sglang", "set it to an absolute path"),
    "sglang_keep_releases": (0, "from 1 to 100"),
    "sglang_package_spec": ("", "a pip requirement"),
    "sglang_pip_index_url": ("pypi.internal", "http:// or https:// URL"),
    "sglang_pip_extra_index_url": ("file:///wheels", "http:// or https:// URL"),
    "sglang_pip_trusted_hosts": (["not a host"], "a list of host names or addresses"),
    "sglang_config_dir": ("etc/sglang", "set it to an absolute path"),
    "sglang_env": ({"HF HOME": "/x"}, "no environment variable name"),
    # sglang_model
    "sglang_model_path": ("models/k2", "set it to the absolute path"),
    "sglang_model_source": ("s3", "must be one of: huggingface, prestaged"),
    "sglang_model_repo": ("Kimi-K2.6", "owner/name"),
    "sglang_model_revision": ("main", "the 40-hex commit hash"),
    "sglang_model_hf_token": ("hf_abc def", "no whitespace"),
    "sglang_model_gated": ("maybe", "not a valid boolean"),
    "sglang_model_hf_endpoint": ("hf-mirror.internal", "http:// or https:// URL"),
    "sglang_model_download_timeout": (-5, "from 60 to 604800"),
    "sglang_model_download_poll": (0, "from 1 to 3600"),
    "sglang_model_disk_reserve_bytes": (-1, "from 0 to"),
    "sglang_model_verify_checksums": ("maybe", "not a valid boolean"),
    # sglang_service
    "sglang_service_nccl_set": ("pcie_p2pp", "is no NCCL set of the catalog; set it to one of: pcie_p2p, pcie_shm"),
    "sglang_service_extra_env": ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, "which this unit owns"),
    "sglang_service_extra_flags": ({"tp_size": 4}, "tp_size changes the GPU layout"),
    "sglang_service_served_model_name": ("kimi k2", "a model name without spaces"),
    "sglang_service_answer_check": ("maybe", "not a valid boolean"),
    "sglang_service_answer_timeout": (0, "from 1 to 86400"),
    "sglang_service_compare_releases": ("maybe", "not a valid boolean"),
    "sglang_service_compare_tolerance": (1.5, "such as 0.1 for 10 %, from 0 to 1"),
    "sglang_service_compare_runs": (0, "from 1 to 20"),
    "sglang_service_compare_prompts": (0, "from 1 to 10000"),
    "sglang_service_compare_concurrency": (0, "from 1 to 1024"),
    "sglang_service_compare_input_tokens": (0, "from 1 to 10485760"),
    "sglang_service_compare_output_tokens": (0, "from 1 to 1048576"),
    "sglang_service_model": ("gpt-5", "has no entry in sglang_service_models"),
    "sglang_service_models": ("kimi", "unable to convert to dict"),
    "sglang_service_tool_call_parser": ("kimi_k3", "sglang_service_tool_call_parser"),
    "sglang_service_reasoning_parser": ("kimi_k3", "sglang_service_reasoning_parser"),
    "sglang_service_sampling_defaults": ("greedy", "must be one of"),
    "sglang_service_context_length": (-1, "from 0 to 10485760 (0 serves the model's own)"),
    "sglang_service_metrics": ("maybe", "not a valid boolean"),
    "sglang_service_host": ("not an address", "set it to an IP address or a host name"),
    "sglang_service_port": (99999, "set it to a whole number from 1 to 65535"),
    "sglang_service_api_key": ("sk-1\n", "no whitespace"),
    "sglang_service_cuda_env_file": ("cuda.env", "set it to an absolute path"),
    "sglang_service_ready_timeout": (-5, "from 1 to 604800"),
    "sglang_service_hang_timeout": (0, "from 1 to 86400"),
    "sglang_service_stop_timeout": (0, "from 1 to 86400"),
    "sglang_service_rollback": ("maybe", "not a valid boolean"),
    "sglang_service_degraded_fails": ("n", "which is not a boolean"),
    "sglang_service_retry": ("maybe", "not a valid boolean"),
    "sglang_service_state_dir": ("state", "set it to an absolute path"),
    "sglang_service_facts_file": ("moefleet.fact", "set it to an absolute path"),
    "sglang_service_runtime_facts_file": ("/etc/./x.fact", "set it to an absolute path"),
    "sglang_service_unit_backups": (-1, "from 0 to 100"),
    "sglang_service_runtime_oom_limit": (0, "from 1 to 100"),
    "sglang_service_p2p_preflight": ("maybe", "not a valid boolean"),
    "sglang_service_p2p_backend": ("p2p_backend.py", "torch, or the absolute path of a backend file"),
    "sglang_service_p2p_timeout": (0, "from 1 to 86400"),
    "sglang_service_p2p_cmdline_file": ("proc/cmdline", "set it to an absolute path"),
    "sglang_service_p2p_sysfs_iommu": ("/sys/../iommu", "set it to an absolute path"),
    "sglang_service_p2p_boot_id_file": ("boot_id", "set it to an absolute path"),
    # fault_watch
    "fault_watch_hang_seconds": (0, "from 1 to 86400"),
    "fault_watch_interval": (0, "from 1 to 3600"),
    "fault_watch_config_file": ("fault-watch.json", "set it to an absolute path"),
    "fault_watch_status_port": (0, "from 1 to 65535"),
    "fault_watch_state_dir": ("var/lib/moefleet", "set it to an absolute path"),
    "fault_watch_retry_window": (-1, "from 0 to 2592000"),
    "fault_watch_sysfs_pci_devices": ("sys/bus/pci", "set it to an absolute path"),
    "fault_watch_reboot_timeout": (0, "from 1 to 86400"),
    "fault_watch_reboot_command": ({"cmd": "reboot"}, "not text"),
    "fault_watch_boot_time_command": (["uptime"], "not text"),
    # sglang_router
    "sglang_router_package_spec": ("", "a pip requirement"),
    "sglang_router_pip_index_url": ("pypi", "http:// or https:// URL"),
    "sglang_router_pip_extra_index_url": ("pypi", "http:// or https:// URL"),
    "sglang_router_pip_trusted_hosts": (["a b"], "a list of host names or addresses"),
    "sglang_router_user": ("S M G", "a user or group name"),
    "sglang_router_group": ("S M G", "a user or group name"),
    "sglang_router_home": ("smg", "set it to an absolute path"),
    "sglang_router_venv": ("venv", "set it to an absolute path"),
    "sglang_router_config_dir": ("etc/smg", "set it to an absolute path"),
    "sglang_router_host": ("every address", "set it to an IP address or a host name"),
    "sglang_router_port": (0, "from 1 to 65535"),
    "sglang_router_prometheus_host": ("", "set it to an IP address or a host name"),
    "sglang_router_prometheus_port": (70000, "from 1 to 65535"),
    "sglang_router_policy": ("fastest", "must be one of"),
    "sglang_router_worker_group": ("gpu workers", "the inventory group of the workers"),
    "sglang_router_admin_key": ("admin key", "no whitespace"),
    "sglang_router_worker_api_key": ("sk 1", "no whitespace"),
    "sglang_router_worker_startup_timeout": (0, "from 1 to 86400"),
    "sglang_router_health_check_interval": (0, "from 1 to 3600"),
    "sglang_router_health_failure_threshold": (0, "from 1 to 1000"),
    "sglang_router_stop_timeout": (0, "from 1 to 86400"),
    "sglang_router_ready_timeout": (0, "from 1 to 86400"),
    "sglang_router_drain_timeout": (0, "from 1 to 86400"),
    "sglang_router_join_timeout": (0, "from 1 to 86400"),
    "sglang_router_guard_interval": (0, "from 1 to 3600"),
    # node_metrics (playbooks/monitoring.yml's first play)
    "node_metrics_port": (0, "set it to a whole number from 1 to 65535"),
    "node_metrics_textfile_dir": ("var/lib/node-exporter", "set it to an absolute path"),
    "node_metrics_gpu_collector": ("dcgm-exporter", "must be one of: nvidia-smi, dcgm, none"),
    "node_metrics_gpu_interval": (0, "set it to a whole number from 1 to 3600"),
    "node_metrics_dcgm_port": (70000, "set it to a whole number from 1 to 65535"),
    "node_metrics_state": ("maybe", "not a valid boolean"),
    "node_metrics_facts_dir": ("/etc/ansible/../facts.d", "set it to an absolute path"),
    # monitoring_server (there too, on the hosts of group monitoring)
    "monitoring_server_config_dir": ("prometheus", "set it to an absolute path"),
    "monitoring_server_port": (-1, "set it to a whole number from 1 to 65535"),
    "monitoring_server_alertmanager_port": ("9093/tcp", "set it to a whole number from 1 to 65535"),
    "monitoring_server_scrape_interval": ("15", "set it to a Prometheus duration such as 30s"),
    "monitoring_server_evaluation_interval": ("0s", "set it to a Prometheus duration such as 30s"),
    "monitoring_server_retention": ("15 days", "set it to a Prometheus duration such as 30s"),
    "monitoring_server_alert_webhook_url": ("hooks.example.com/T0", "set it to an http:// or https:// URL"),
    "monitoring_server_worker_group": ("gpu workers", "the inventory group of the workers"),
    "monitoring_server_router_group": ("smg-gateways", "the inventory group of the gateways"),
    "monitoring_server_down_for": ("1.5m", "set it to a Prometheus duration such as 30s"),
    "monitoring_server_kv_usage_threshold": (95, "set it to a fraction of the KV cache in use, from 0 to 1"),
    "monitoring_server_queue_threshold": (0, "set it to a whole number from 1 to 1000000"),
    "monitoring_server_pressure_for": ("5 minutes", "set it to a Prometheus duration such as 30s"),
    "monitoring_server_ttft_p99_seconds": (400, "from 1 to 399 (SGLang's first-token histogram ends at 400 s)"),
    "monitoring_server_itl_p99_seconds": (0, "set it to a number of seconds, from 0.001 to 60"),
    "monitoring_server_latency_for": ("m10", "set it to a Prometheus duration such as 30s"),
    "monitoring_server_gpu_temperature_celsius": (870, "set it to a whole number from 1 to 120"),
    "monitoring_server_xid_window": ("", "set it to a Prometheus duration such as 30s"),
    "monitoring_server_maintenance_gap": ("30", "set it to a Prometheus duration such as 30s"),
    "monitoring_server_maintenance_max_seconds": (0, "set it to a whole number from 60 to 2592000"),
    "monitoring_server_runtime_failure_window_seconds": ("30m", "set it to a whole number from 60 to 2592000"),
    # the playbooks' per-host inputs (moefleet_host_inputs_spec)
    "moefleet_allow_unfit": ("sure", "not a valid boolean"),
    "moefleet_gpu_memory_gib": (0, "from 1 to 4096"),
}

# The run's own inputs (playbook_inputs.INPUTS, given with -e): a bad value each.
BAD_RUN = {
    "moefleet_serial": ([1, 0], "batch size 2 of moefleet_serial is 0, which Ansible takes as every host at once"),
    "moefleet_max_unavailable": ("0%", "which is no host"),
    "moefleet_max_fail_percentage": ("150", "set it to a whole number from 0 to 100"),
    "moefleet_any_errors_fatal": ("maybe", "which is not a boolean"),
    "moefleet_health_gate": ("maybe", "which is not a boolean"),
    "moefleet_through_routers": ("maybe", "which is not a boolean"),
    "moefleet_maintenance_window": ("perhaps", "which is not a boolean"),
    "confirm": ("1", "set it to yes or no"),
    # the benchmark sweep's (playbooks/bench.yml), checked against the catalog as validate.yml checks them
    "apply": ("maybe", "which is not a boolean"),
    "apply_objective": ("fastest", "set it to one of single_stream, throughput, slo"),
    "profiles": ("tp8,tp3", "profiles names tp3, which the catalog does not have; name profiles of the catalog"),
    "bench_ladder": ("1,64", "give a non-empty list of whole numbers from 1 to 100000"),
    "bench_input_len": (0, "set it to a whole number from 1 to 10485760"),
    "bench_output_len": ("512 tokens", "set it to a whole number from 1 to 10485760"),
    "bench_prompts_min": (0, "set it to a whole number from 1 to 1000000"),
    "bench_prompts_per_concurrency": ("-2", "set it to a number from 0 to 10000"),
    "bench_prompts_max": (2.5, "set it to a whole number from 1 to 1000000"),
    "bench_dataset_name": ("sharegpt", "set it to one of random, random-ids"),
    "bench_tokenize_prompt": ("maybe", "which is not a boolean"),
    "bench_dataset_path": ("sharegpt.json", "set it to an absolute path on the host, or empty"),
    "bench_seed": (-1, "set it to a whole number from 0 to 999999999"),
    "bench_server_host": ("not an address", "set it to an IP address or a host name"),
    "bench_slo_p99_itl_ms": ("null", "or to null for no bound: -e '{\"bench_slo_p99_itl_ms\": null}'"),
    "bench_slo_p99_ttft_ms": (0, "set it to a number above 0"),
    "bench_report_dir": ("", "set it to a directory"),
    "bench_report_stem": ("out/bench", "set it to a file name without '/'"),
    "bench_service_extra_env": ({"CUDA_VISIBLE_DEVICES": "0,1"}, "which this unit owns"),
    "bench_rollback": ("sometimes", "which is not a boolean"),
    "bench_level_timeout": (0, "set it to a whole number from 1 to 604800"),
    "bench_apply_vars_file": ("group_vars/blackwell", "set it to a YAML file's path (.yml or .yaml)"),
}

# playbooks/bench.yml: the operator's variables it reads, each documented in its header and declared in
# playbook_inputs.INPUTS (checked by validate.yml's first play), except bench_host: the sweep play's first task checks
# it against the run's hosts after --limit, known only there, on the controller (tests/unit/test_bench_playbook.py).
BENCH = ROOT / "playbooks" / "bench.yml"
BENCH_TASKS = ROOT / "playbooks" / "tasks" / "bench_profile.yml"
BENCH_CHECKED_IN_PLAY = {"bench_host"}


def options(role: str) -> dict:
    text = (ROOT / "roles" / role / "meta" / "argument_specs.yml").read_text()
    return yaml.safe_load(text)["argument_specs"]["main"].get("options") or {}


def role_of(name: str) -> str | None:
    return next((role for role in [*HOST_ROLES, *ROUTER_ROLES, *MONITORING_ROLES] if name in options(role)), None)


def refusals(name: str, value: object) -> list[str]:
    """Every sentence validate.yml's checks give a host that sets ``name`` to ``value`` (and nothing else)."""
    role = role_of(name)
    spec = options(role) if role else HOST_SPEC
    given = {name: value}
    # validate.yml gives the sglang_service role's spec its profile and catalog, as serve.yml passes them
    serve = {"sglang_service_profile": "tp8", "sglang_service_catalog": CATALOG} if role == "sglang_service" else {}
    found = ArgumentSpecValidator(spec).validate({**given, **serve}, validate_role_argument_spec=True).error_messages
    roles = [role] if role else []
    found += filters.input_problems(roles, given, str(ROOT / "roles"), {} if role else HOST_SPEC, "gpu-1", CATALOG)
    if role in HOST_ROLES or role is None:
        # play 1: resolve_profiles' rules between inputs, the host's values over the roles' defaults it reads
        defaults = {}
        for source in ("nvidia_driver", "sglang_model", "sglang_service"):
            defaults.update(role_defaults(source))
        inputs = {**defaults, "sglang_model_source": "huggingface", "sglang_model_revision": "a" * 40, **given}
        found += profiles.host_problems("gpu-1", inputs, CATALOG, "tp8")
    return found


def spec_variables() -> set[str]:
    names = set(HOST_SPEC)
    for role in sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists()):
        names |= set(options(role))
    return names - set(NOT_CHECKED_BY_VALIDATE)


def test_every_input_has_a_bad_value():
    """A variable added to an argument spec (or to the playbooks' inputs) without a row here fails this test."""
    assert sorted(spec_variables() - set(BAD)) == [], "add a bad value for these, and a check that refuses it"
    assert sorted(set(BAD) - spec_variables()) == [], "these rows name no variable of a spec the playbooks check"
    assert set(BAD_RUN) == set(playbook_inputs.INPUTS)


def _set_by(node) -> set[str]:
    """The names a task file sets itself: set_fact keys, registered results, loop variables."""
    found: set[str] = set()
    if isinstance(node, list):
        for item in node:
            found |= _set_by(item)
    elif isinstance(node, dict):
        facts = node.get("ansible.builtin.set_fact")
        found |= set(facts) if isinstance(facts, dict) else set()
        found |= {node["register"]} if isinstance(node.get("register"), str) else set()
        control = node.get("loop_control")
        found |= {control["loop_var"]} if isinstance(control, dict) and "loop_var" in control else set()
        for value in node.values():
            found |= _set_by(value)
    return found


def bench_reads() -> set[str]:
    """The variables an operator sets for playbooks/bench.yml: its sweep play's vars that are no template of other
    variables, and what its files read with a default (or test for) that they do not set themselves and that is no
    role's input (the roles' argument specs and validate.yml's moefleet_host_inputs_spec declare those)."""
    (play,) = [p for p in yaml.safe_load(BENCH.read_text()) if p.get("hosts") == "blackwell"]
    names = {k for k, v in play["vars"].items() if not (isinstance(v, str) and "{{" in v)}
    texts = [BENCH.read_text(), BENCH_TASKS.read_text()]
    for text in texts:
        code = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
        names |= set(re.findall(r"(?<![.\w'\"])([a-z_][a-z0-9_]*)\s*\|\s*default\(", code))
        names |= set(re.findall(r"(?<![.\w'\"])([a-z_][a-z0-9_]*) is (?:not )?defined", code))
    set_here = set(play["vars"]) - names | _set_by(play["tasks"]) | _set_by(yaml.safe_load(BENCH_TASKS.read_text()))
    role_inputs = set(HOST_SPEC).union(*(options(role) for role in [*HOST_ROLES, *ROUTER_ROLES]))
    return names - set_here - role_inputs


def bench_documented() -> set[str]:
    """The variables bench.yml's header lists (its "Variables" block)."""
    header = BENCH.read_text().split("\n- name:", 1)[0]
    block = header.split("# Variables", 1)[1].split("\n#\n", 1)[0]
    return set(re.findall(r"^#   ([a-z_][a-z0-9_]*) ", block, re.M))


def test_every_bench_input_is_documented_declared_and_checked():
    """A variable bench.yml starts reading without a row in playbook_inputs.INPUTS (and so without the check
    validate.yml runs before any host is read) fails here, as does one its header does not document."""
    reads, documented = bench_reads(), bench_documented()
    assert {"profiles", "bench_ladder", "apply", "bench_host", "bench_report_stem"} <= reads  # the scan finds them
    assert sorted(reads - documented) == [], "document these in playbooks/bench.yml's header"
    assert sorted(reads - set(playbook_inputs.INPUTS) - BENCH_CHECKED_IN_PLAY) == [], "declare these in INPUTS"
    declared = {name for name in playbook_inputs.INPUTS if re.search(rf"\b{name}\b", BENCH.read_text())}
    assert sorted(documented - reads - {"bench_server_host"}) == [], "these are documented but not read"
    assert declared >= documented - BENCH_CHECKED_IN_PLAY


def test_the_sweeps_defaults_pass_the_checks():
    """bench.yml's own defaults (its sweep play's vars) are values the checks take."""
    (play,) = [p for p in yaml.safe_load(BENCH.read_text()) if p.get("hosts") == "blackwell"]
    defaults = {k: v for k, v in play["vars"].items() if k in playbook_inputs.INPUTS and "{{" not in str(v)}
    assert len(defaults) >= 15
    assert playbook_inputs.problems(defaults, catalog=CATALOG) == []


@pytest.mark.parametrize(("value", "asked"), [
    ("tp8", ["tp8"]), ("tp8, ep8", ["tp8", "ep8"]), ("tp8,,ep8,", ["tp8", "ep8"]),
    (["tp2ep4", "tp8"], ["tp2ep4", "tp8"]),
    ("", None), (" , ", None), ([], None), ([8], None), ({"tp8": 1}, None), ([" tp8"], None),
])
def test_profiles_are_read_as_bench_yml_reads_them(value, asked):
    """playbook_inputs.profile_names against bench.yml's own bench_asked expression (a list, or "a,b")."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    assert playbook_inputs.profile_names(value) == asked
    (play,) = [p for p in yaml.safe_load(BENCH.read_text()) if p.get("hosts") == "blackwell"]
    read = Templar(loader=DataLoader(), variables={"profiles": value}).template(
        trust_as_template(play["vars"]["bench_asked"]))
    if asked is not None:
        assert read == asked
    else:  # what bench.yml would read is no usable list of names: refused before it gets there
        assert playbook_inputs.value_problem("profiles", value, catalog=CATALOG)


def test_without_the_catalog_only_the_form_of_profiles_is_checked():
    """moefleet bench run checks -e and --profiles before the run, without the catalog (extra profiles live in the
    inventory): unknown names are validate.yml's to refuse, with the catalog."""
    assert playbook_inputs.problems({"profiles": ["tp8", "tp3"]}) == []
    assert playbook_inputs.problems({"profiles": []})
    assert playbook_inputs.problems({"profiles": ["tp8", "tp3"]}, catalog=CATALOG)


def test_a_sweep_input_in_the_inventory_is_refused_saying_why():
    """bench.yml's play vars hold the defaults, which override the inventory: a value there would be ignored."""
    found = playbook_inputs.problems({}, {"gpu-1": {"bench_ladder": [1, 8]}}, {"bench_ladder": ["gpu-1"]})
    assert found == ["bench_ladder is set in the inventory for gpu-1, which the playbooks would ignore, at least in "
                     "part: playbooks/bench.yml's sweep play holds its defaults as play vars, which override the "
                     "inventory's. Remove it from the inventory and pass it for the run instead: "
                     "-e '{\"bench_ladder\": [1, 8]}'."]


def test_validate_yml_checks_every_role_the_playbooks_run_on_hosts():
    roles = {p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "argument_specs.yml").exists()}
    assert set(HOST_ROLES) | set(ROUTER_ROLES) | set(MONITORING_ROLES) == roles - {"router_membership"}


def _imports(play: dict) -> list[str]:
    return [task.get("ansible.builtin.import_tasks") for task in play.get("tasks") or []]


def _roles(play: dict) -> set[str]:
    return {entry["role"] if isinstance(entry, dict) else entry for entry in play.get("roles") or []}


def _roles_checked(play: dict, groups: list[str]) -> list[str]:
    """moefleet_input_roles as the check play gives it to a host of ``groups``."""
    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    value = play["vars"]["moefleet_input_roles"]
    if isinstance(value, list):
        return value
    return Templar(loader=DataLoader(), variables={"group_names": groups}).template(trust_as_template(value))


def _pattern_groups(pattern: str) -> set[str]:
    return {part for part in pattern.split(":") if part and not part.startswith("!")}


def test_monitoring_yml_checks_its_roles_inputs_first_on_the_controller():
    """Its first play checks, for every host a later play runs a role on, that role's inputs with the task file
    validate.yml's router play runs, without contacting the host (no facts; validate_argument_spec and assert are
    the controller's), and one host's refusal stops the run before any play changes a host."""
    check, *plays = MONITORING
    assert _imports(ROUTER_PLAY) == [ROLE_INPUTS] and _imports(check) == [ROLE_INPUTS]
    assert check["gather_facts"] is False and check["any_errors_fatal"] is True
    assert set().union(*(_pattern_groups(play["hosts"]) for play in plays)) == _pattern_groups(check["hosts"])
    for play in plays:
        for group in _pattern_groups(play["hosts"]):
            assert _roles(play) <= set(_roles_checked(check, [group])), (play["name"], group)
    assert set(_roles_checked(check, ["monitoring"])) == set(MONITORING_ROLES)
    assert _roles_checked(check, ["blackwell"]) == ["node_metrics"]
    tasks = yaml.safe_load((ROOT / "playbooks" / ROLE_INPUTS).read_text())
    actions = {key for task in tasks for key in task if key.startswith("ansible.builtin.")}
    assert actions == {"ansible.builtin.validate_argument_spec", "ansible.builtin.assert"}


def test_monitoring_files_yml_checks_what_it_writes_the_files_from():
    """The scraped hosts' node_metrics inputs and the controller's monitoring_server inputs, before any file."""
    check, write = MONITORING_FILES
    assert _imports(check) == [ROLE_INPUTS] and _roles_checked(check, ["blackwell"]) == ["node_metrics"]
    assert check["gather_facts"] is False and check["any_errors_fatal"] is True
    steps = [task.get("ansible.builtin.import_tasks") or task["name"] for task in write["tasks"]]
    assert steps.index(ROLE_INPUTS) < steps.index("Write them")
    (checked,) = [task for task in write["tasks"] if task.get("ansible.builtin.import_tasks") == ROLE_INPUTS]
    assert checked["vars"]["moefleet_input_roles"] == ["monitoring_server"]


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_of_each_role_input_is_refused_naming_it(name):
    value, sentence = BAD[name]
    found = refusals(name, value)
    assert any(name in s and sentence in s for s in found), found


@pytest.mark.parametrize("name", sorted(BAD_RUN))
def test_a_bad_value_of_each_run_input_is_refused_naming_it(name):
    value, sentence = BAD_RUN[name]
    found = playbook_inputs.problems({name: value}, catalog=CATALOG)
    assert any(name in s and sentence in s for s in found), found


def test_the_roles_defaults_pass_every_check():
    """The rules refuse no role's own default (those that are no template of other variables)."""
    for role in [*HOST_ROLES, *ROUTER_ROLES, *MONITORING_ROLES]:
        defaults = role_defaults(role)
        plain = {k: v for k, v in defaults.items() if k in options(role) and not (isinstance(v, str) and "{{" in v)}
        assert playbook_inputs.input_problems(plain, options(role), "gpu-1", CATALOG) == [], role


SHIPPED = ["inventory/example/group_vars/blackwell/main.yml", "inventory/sim/group_vars/all.yml",
           "inventory/example/group_vars/routers/main.yml", "inventory/sim/group_vars/routers.yml",
           "inventory/sim/group_vars/monitoring.yml"]


@pytest.mark.parametrize("path", SHIPPED)
def test_the_shipped_inventories_pass_every_check(path):
    file = ROOT / path
    if not file.exists():
        pytest.skip(f"{path} is not shipped")
    values = {k: v for k, v in (yaml.safe_load(file.read_text()) or {}).items()
              if not (isinstance(v, str) and "{{" in v)}
    spec = dict(HOST_SPEC)
    for role in [*HOST_ROLES, *ROUTER_ROLES, *MONITORING_ROLES]:
        spec.update(options(role))
    assert playbook_inputs.input_problems(values, spec, "gpu-1", CATALOG) == []


@pytest.mark.parametrize(("env", "fix"), [
    ({"NCCL_P2P_DISABLE": "1"}, "which the NCCL set pcie_shm defines"),
    ({"NCCL_ALGO": "Tree"}, "set sglang_service_nccl_set to a set of the catalog instead"),
    ({"CUDA_DEVICE_ORDER": "FASTEST_FIRST"}, "the unit sets it to PCI_BUS_ID"),
    ({"SGLANG_ENABLE_JIT_DEEPGEMM": "1"}, "the unit sets it to 0"),
    ({"HF_HOME": "/data/hf"}, "set sglang_env instead"),
    ({"NCCL_DEBUG": {"level": "INFO"}}, "set it to text"),
])
def test_extra_env_names_the_unit_owns_are_refused_with_what_to_set(env, fix):
    found = refusals("sglang_service_extra_env", env)
    assert any(fix in s for s in found), found


def test_extra_env_that_sets_nothing_the_unit_owns_passes():
    assert refusals("sglang_service_extra_env", {"NCCL_DEBUG": "INFO", "SGLANG_SIM_FAULTS": "[]"}) == []


@pytest.mark.parametrize("value", ["127.0.0.1", "0.0.0.0", "::", "[::1]", "fd00::5", "gpu-01.lab.internal", "gpu1"])
def test_addresses_and_host_names_pass(value):
    assert refusals("sglang_service_host", value) == []


@pytest.mark.parametrize("value", ["not an address", "", "10.0.0.300", "http://10.0.0.1", "gpu_01", {"ip": "1.2.3.4"}])
def test_anything_else_is_no_address(value):
    assert refusals("sglang_service_host", value)


def test_a_secret_is_never_echoed():
    found = refusals("sglang_service_api_key", "sk-sentinel-7f3a secret")
    assert found and not any("sentinel" in s for s in found)
    found = refusals("sglang_router_admin_key", {"key": "sk-sentinel-7f3a"})
    assert found and not any("sentinel" in s for s in found)
    # a webhook URL carries its token in the path (its spec says no_log)
    for bad in ("hooks.example.com/services/sentinel-7f3a", {"url": "https://hooks.example.com/sentinel-7f3a"}):
        found = refusals("monitoring_server_alert_webhook_url", bad)
        assert found and not any("sentinel" in s for s in found)


@pytest.mark.parametrize("value", ["15s", "5m", "1h30m", "15d", "2w", "500ms", "1y"])
def test_prometheus_durations_pass(value):
    assert refusals("monitoring_server_retention", value) == []


def test_an_empty_webhook_url_sends_alerts_nowhere_and_passes():
    assert refusals("monitoring_server_alert_webhook_url", "") == []
    assert refusals("monitoring_server_alert_webhook_url", "https://hooks.example.com/services/T0/B1") == []


def test_context_length_zero_is_the_models_own_and_passes():
    assert refusals("sglang_service_context_length", 0) == []
    assert refusals("sglang_service_context_length", "131072") == []


def test_each_playbook_that_serves_names_itself_to_validate_yml():
    """validate.yml's outage check reads serve.yml's vars from the playbook moefleet_serving_playbook names: each
    playbook that imports both names itself (a copy under another name would check another file's vars)."""
    serving = []
    for path in sorted((ROOT / "playbooks").glob("*.yml")):
        plays = yaml.safe_load(path.read_text()) or []
        imports = {play.get("ansible.builtin.import_playbook"): play for play in plays if isinstance(play, dict)}
        if "serve.yml" in imports and "validate.yml" in imports:
            serving.append(path.name)
            assert imports["validate.yml"]["vars"]["moefleet_serving_playbook"] == path.name
    assert serving == ["deploy.yml", "rollout.yml"]
