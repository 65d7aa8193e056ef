"""moefleet's state and the GPUs' figures as node_exporter textfiles (plugins/module_utils/fleet_metrics.py, run on
the hosts by roles/node_metrics/files/moefleet-textfile): what alerts read, linted by the real promtool."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import fleet_metrics, host_faults

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import promtool  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
LOCAL = {"asked_profile": "tp2ep4", "serving_profile": "ep8", "outcome": "degraded", "updated": "2026-12-02T10:00:00Z",
         "last_rollback": {"time": "2026-12-02T09:59:00+00:00", "from": "tp2ep4", "to": "ep8", "reason": "OOM"}}
RUNTIME = {"failures": [{"time": "2026-12-02T10:05:00+00:00", "state": "oom"},
                        {"time": "2026-12-02T10:07:30+00:00", "state": "oom"},
                        {"time": "2026-12-02T10:06:00+00:00", "state": "crashed"}], "ooms": 2}
SMI = ("0, GPU-aaaa, NVIDIA RTX PRO 6000 Blackwell Server Edition, 00000000:17:00.0, 45, 118.35, 100, 90000, 7000\n"
       "1, GPU-bbbb, NVIDIA RTX PRO 6000 Blackwell Server Edition, 00000000:3D:00.0, 32, [N/A], 0, 512, 96000\n")
KERNEL = ("NVRM: Xid (PCI:0000:3d:00): 13, pid=1234, name=python3, Graphics SM Warp Exception\n"
          "NVRM: Xid (PCI:0000:3d:00): 79, pid=1234, name=python3, GPU has fallen off the bus.\n")


def samples(text: str) -> dict[str, float]:
    return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
            if line and not line.startswith("#")}


def lint(text: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(promtool.path()), "check", "metrics"], input=text, capture_output=True, text=True)


def test_a_host_on_a_fallback_with_runtime_failures():
    got = samples(fleet_metrics.state_text(LOCAL, RUNTIME))
    assert got['moefleet_host_info{asked_profile="tp2ep4",serving_profile="ep8",outcome="degraded"}'] == 1
    assert got["moefleet_serving_as_asked"] == 0
    assert got['moefleet_runtime_failures{state="oom"}'] == 2
    assert got['moefleet_runtime_failures{state="crashed"}'] == 1
    # the newest of each state, not the last in the list
    assert got['moefleet_runtime_last_failure_timestamp_seconds{state="oom"}'] == 1796206050.0
    assert got["moefleet_last_rollback_timestamp_seconds"] == 1796205540.0
    assert got["moefleet_last_run_timestamp_seconds"] == 1796205600.0


def test_a_host_that_serves_what_it_was_asked_and_a_host_never_deployed():
    ready = samples(fleet_metrics.state_text({**LOCAL, "serving_profile": "tp2ep4", "outcome": "ready"}, {}))
    assert ready["moefleet_serving_as_asked"] == 1
    assert ready['moefleet_runtime_last_failure_timestamp_seconds{state="oom"}'] == 0
    never = samples(fleet_metrics.state_text({}, None))
    assert never['moefleet_host_info{asked_profile="",serving_profile="",outcome="none"}'] == 1
    assert never["moefleet_serving_as_asked"] == 0


def test_the_state_text_passes_promtools_lint():
    result = lint(fleet_metrics.state_text(LOCAL, RUNTIME))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_lint_can_fail():
    assert lint("# TYPE x gauge\nx{a=\"1\" 1\n").returncode != 0


def test_gpus_under_the_dcgm_exporters_names_with_the_last_xid_per_gpu():
    rows = fleet_metrics.parse_smi_csv(SMI)
    xids = fleet_metrics.last_xids(host_faults.classify_kernel(line) for line in KERNEL.splitlines())
    text = fleet_metrics.gpu_text(rows, xids, "gpu-node-01")
    got = samples(text)
    gpu0 = ('{gpu="0",UUID="GPU-aaaa",pci_bus_id="00000000:17:00.0",device="nvidia0",'
            'modelName="NVIDIA RTX PRO 6000 Blackwell Server Edition",Hostname="gpu-node-01"}')
    assert got["DCGM_FI_DEV_GPU_TEMP" + gpu0] == 45
    assert got["DCGM_FI_DEV_FB_USED" + gpu0] == 90000
    assert got["DCGM_FI_DEV_XID_ERRORS" + gpu0] == 0
    assert got["DCGM_FI_DEV_XID_ERRORS" + gpu0.replace('"0"', '"1"').replace("aaaa", "bbbb")
               .replace("17:00.0", "3D:00.0").replace("nvidia0", "nvidia1")] == 79
    # a field nvidia-smi cannot read ([N/A]) is left out, not written as a number
    assert sum(1 for k in got if k.startswith("DCGM_FI_DEV_POWER_USAGE")) == 1
    assert got["moefleet_gpu_collector_success"] == 1 and got["moefleet_gpus"] == 2
    # promtool's lint asks for snake_case names: the DCGM exporter's own names are kept on purpose (rules and
    # dashboards then work with either collector); anything else it says is a finding.
    result = lint(text)
    findings = [line for line in (result.stdout + result.stderr).splitlines() if line.strip()]
    assert findings and all(line.startswith("DCGM_FI_DEV_") and "camelCase" in line for line in findings), findings


def test_nvidia_smi_that_does_not_answer_is_reported_not_hidden():
    got = samples(fleet_metrics.gpu_text([], {}, "h", ok=False))
    assert got == {"moefleet_gpu_collector_success": 0, "moefleet_gpus": 0}


def test_the_simulated_nvidia_smi_answers_the_collectors_query():
    """The lab's nvidia-smi takes the very query the collector sends (the lab test reads its figures through
    Prometheus)."""
    query = ",".join(fleet_metrics.SMI_FIELDS)
    result = subprocess.run([sys.executable, str(ROOT / "sim" / "gpu" / "nvidia-smi"), f"--query-gpu={query}",
                             "--format=csv,noheader,nounits"], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert len(fleet_metrics.parse_smi_csv(result.stdout)) == 8


def test_a_label_value_with_quotes_and_newlines_is_escaped():
    text = fleet_metrics.state_text({"asked_profile": 'a"b\\c\nd', "outcome": "failed"}, {})
    assert 'asked_profile="a\\"b\\\\c\\nd"' in text
    assert lint(text).returncode == 0


def test_the_fault_watchers_record_says_whether_the_host_is_out():
    health = {"state": "unfit", "reason": "gpu 3: Xid 79 GPU has fallen off the bus", "events": [
        {"time": "2026-12-02T10:01:00+00:00", "code": 13, "unfit": False},
        {"time": "2026-12-02T10:02:00+00:00", "code": 79, "unfit": True}]}
    got = samples(fleet_metrics.state_text(LOCAL, RUNTIME, health))
    assert got['moefleet_host_unfit{state="unfit"}'] == 1 and got['moefleet_host_unfit{state="hardware"}'] == 0
    assert got["moefleet_host_last_fault_timestamp_seconds"] == 1796205720.0
    healthy = samples(fleet_metrics.state_text(LOCAL, RUNTIME, {"state": "healthy", "events": health["events"]}))
    assert healthy['moefleet_host_unfit{state="unfit"}'] == 0
    never = samples(fleet_metrics.state_text(LOCAL, RUNTIME))  # a host the watcher never recorded anything on
    assert never['moefleet_host_unfit{state="unfit"}'] == 0 and never["moefleet_host_last_fault_timestamp_seconds"] == 0


def test_the_xids_are_the_fault_watchers_reading_of_the_kernel_log():
    """The collector reads Xids as the watcher does (host_faults.classify_kernel): other NVRM lines and PCIe events
    are no Xid; the last one per GPU counts."""
    lines = ["NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04",
             "NVRM: Xid (PCI:0000:3d:00): 13, pid=1234, name=python3, Graphics SM Warp Exception",
             "pcieport 0000:40:01.1: AER: Uncorrectable (Fatal) error message received from 0000:41:00.0",
             "NVRM: Xid (PCI:0000:17:00): 43, pid=99, name=python3, Ch 00000008",
             "NVRM: Xid (PCI:0000:3d:00): 79, pid=1234, name=python3, GPU has fallen off the bus."]
    assert fleet_metrics.last_xids(host_faults.classify_kernel(line) for line in lines) == {"3d:00": 79, "17:00": 43}


def test_maintenance_says_which_run_works_on_the_host_with_the_same_series_at_its_end():
    started = samples(fleet_metrics.maintenance_text("rollout", 1796205600))
    assert started == {'moefleet_maintenance_start_timestamp_seconds{reason="deploy"}': 0,
                       'moefleet_maintenance_start_timestamp_seconds{reason="rollout"}': 1796205600,
                       'moefleet_maintenance_start_timestamp_seconds{reason="remediate"}': 0}
    ended = samples(fleet_metrics.maintenance_text("rollout", 0))
    assert set(ended) == set(started) and set(ended.values()) == {0}
    assert lint(fleet_metrics.maintenance_text("remediate", 1796205600)).returncode == 0
    with pytest.raises(ValueError, match="none of deploy, rollout, remediate"):
        fleet_metrics.maintenance_text("upgrade", 1)
