"""The default scenario's host serves tp2ep4 through sglang.service, as the product promises."""

import json

import pytest

UNIT = "sglang.service"
API_KEY = "molecule-test-key-7f3a"  # set by converge.yml
AUTH = f"-H 'Authorization: Bearer {API_KEY}'"


@pytest.fixture(autouse=True)
def journal_on_failure(host, request):
    yield
    report = getattr(request.node, "rep_call", None)
    if report is not None and report.failed:
        print(host.run(f"journalctl -u {UNIT} --no-pager -n 60").stdout)


def test_unit_runs_the_profile_flags(host):
    exec_start = host.run(f"systemctl show -p ExecStart --value {UNIT}").stdout
    assert "--tp-size 8" in exec_start.replace('"', "")
    assert "--ep-size 4" in exec_start.replace('"', "")
    assert "sglang.launch_server" in exec_start


def test_unit_has_the_pcie_nccl_settings(host):
    env = host.run(f"systemctl show -p Environment --value {UNIT}").stdout.split()
    for setting in ("NCCL_IB_DISABLE=1", "NCCL_P2P_LEVEL=SYS", "NCCL_ALGO=Ring",
                    "SGLANG_ENABLE_JIT_DEEPGEMM=0", "CUDA_DEVICE_ORDER=PCI_BUS_ID"):
        assert setting in env


def test_unit_passes_systemd_analyze_verify_silently(host):
    # systemd ignores some bad settings with only a warning and exits 0: nothing may be printed.
    result = host.run("systemd-analyze verify /etc/systemd/system/sglang.service")
    assert (result.rc, result.stdout + result.stderr) == (0, "")


def test_service_runs_as_the_service_user(host):
    service = host.service("sglang")
    assert service.is_running and service.is_enabled
    pid = host.run(f"systemctl show -p MainPID --value {UNIT}").stdout.strip()
    assert host.run(f"ps -o user= -p {pid}").stdout.strip() == "sglang"


def test_listens_on_loopback_only(host):
    assert host.socket("tcp://127.0.0.1:30000").is_listening
    assert not host.socket("tcp://0.0.0.0:30000").is_listening


def test_v1_models_names_the_served_model(host):
    out = host.check_output(f"curl -sf {AUTH} http://127.0.0.1:30000/v1/models")
    assert [m["id"] for m in json.loads(out)["data"]] == ["kimi-k2.6"]


def test_server_memory_on_all_eight_gpus(host):
    used = host.check_output("nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits").split()
    assert len(used) == 8
    # Weights alone are tens of GiB per GPU for K2.6 under tp2ep4.
    assert all(int(mib) > 60 * 1024 for mib in used), used


def test_api_key_is_required(host):
    code = host.check_output("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:30000/v1/models")
    assert code == "401"


def test_api_key_stays_out_of_journal_unit_and_command_lines(host):
    assert API_KEY not in host.run(f"journalctl -u {UNIT} --no-pager").stdout
    assert "[REDACTED]" in host.run(f"journalctl -u {UNIT} --no-pager | grep server_args=").stdout
    assert API_KEY not in host.file("/etc/systemd/system/sglang.service").content_string
    assert API_KEY not in host.check_output("ps -eo args")
    credential = host.file("/etc/sglang/credentials/sglang-secrets.yaml")
    assert (credential.user, credential.group, credential.mode) == ("root", "root", 0o600)
