"""GPUs CUDA cannot use, and GPUs that fail: causes gpu_unavailable and gpu_fault, with advice that follows the reason.

The messages are quoted from public reports (the source of each is next to it) or from the code that prints
them (PyTorch's c10/cuda/CUDAFunctions.cpp, SGLang 0.5.10's utils/common.py, the CUDA runtime's error strings).
Before these causes existed, each of them was "crashed (other): a reason this classifier does not know", and
"Found no NVIDIA driver" or "No CUDA GPUs are available" got the advice for a driver branch that is too old.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import rollback
from ansible_collections.moefleet.serving.plugins.module_utils.sglang_log import (
    CAUSES,
    GPU_REASONS,
    LogFollower,
    advice_for,
    classify,
    gpu_reason,
)

REPO = Path(__file__).resolve().parents[2]
LOGS = REPO / "tests" / "data" / "sglang-logs"
MARKER = "[2026-04-02 07:41:28 TP0] Scheduler hit an exception: Traceback (most recent call last):"
SIGQUIT = "[2026-04-02 07:41:28] Received sigquit from a child process. It usually means the child failed."
UVM_LOG = "45-crash_other-gpu-unavailable-uvm-node-closed-set-device-journal.log"
LAUNCHER_LOG = "46-crash_other-gpu-unavailable-launcher-no-accelerator-cuda-warning-journal.log"

# (the exception line, its reason) as the failing process prints it
EXCEPTION_LINES = [
    # https://github.com/microsoft/Bringing-Old-Photos-Back-to-Life/issues/52 (torch.cuda.set_device -> _lazy_init)
    (
        "RuntimeError: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing env "
        "variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero.",
        "no_device",
    ),
    # https://github.com/jiaw-z/CoR-GS/issues/23 (torch.cuda.set_device -> _lazy_init)
    ("RuntimeError: No CUDA GPUs are available", "no_device"),
    # https://github.com/nitishsrivastava/deepnet/issues/28 ("Updated the kernel, but didn't reboot")
    ("cudamat.cudamat.CUDAMatException: CUDA error: no CUDA-capable device is detected", "no_device"),
    # https://github.com/rapidsai/deployment/pull/116
    (
        "RuntimeError: CUDA error at: .../rmm/include/rmm/cuda_device.hpp:56: cudaErrorNoDevice no CUDA-capable "
        "device is detected",
        "no_device",
    ),
    # https://github.com/OdingdongO/pytorch_classification/issues/1 (PyTorch before 1.0)
    (
        "RuntimeError: cuda runtime error (38) : no CUDA-capable device is detected at "
        "/opt/conda/conda-bld/pytorch_1524584710464/work/aten/src/THC/THCGeneral.cpp:70",
        "no_device",
    ),
    # https://github.com/aim-uofa/AdelaiDet/issues/331
    ("RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.", "no_device"),
    # SGLang's get_device(): https://github.com/sgl-project/sglang/issues/27487 and, older, .../issues/7547
    ("RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available.", "no_cuda"),
    ("RuntimeError: No accelerator (CUDA, XPU, HPU) is available.", "no_cuda"),
    # PyTorch's words when no driver answers at all (c10/cuda/CUDAFunctions.cpp)
    (
        "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed "
        "a driver from http://www.nvidia.com/Download/index.aspx",
        "no_driver",
    ),
    # pynvml's generated class (https://github.com/Ali-Yazdanpanah/gpu-monitoring-tool monitoring/monitor.py)
    ("pynvml.NVMLError_DriverNotLoaded: Driver Not Loaded", "no_driver"),
    # SGLang 0.5.10's get_nvgpu_memory_capacity wraps nvidia-smi's stderr: "nvidia-smi failed (exit code N: ...)";
    # nvidia-smi's text from https://github.com/CFSworks/nvml_fix/issues/36 and
    # https://github.com/mozilla/translations/issues/1167 (exit code 18)
    (
        "RuntimeError: nvidia-smi failed (exit code 9: NVIDIA-SMI has failed because it couldn't communicate with "
        "the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running.).",
        "no_driver",
    ),
    (
        "RuntimeError: nvidia-smi failed (exit code 18: Failed to initialize NVML: Driver/library version mismatch",
        "driver_mismatch",
    ),
    # https://github.com/CompVis/stable-diffusion/issues/438: CUDA error 803 (cudaErrorSystemDriverMismatch)
    (
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 803: system has unsupported display driver / "
        "cuda driver combination",
        "driver_mismatch",
    ),
    # https://github.com/haotian-liu/LLaVA/issues/683: CUDA error 802, nvidia-fabricmanager not running
    (
        "RuntimeError: Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling "
        "NumCudaDevices() that might have already set an error? Error 802: system not yet initialized",
        "fabric_manager",
    ),
    # https://github.com/rossumai/nvgpu/issues/6
    ("NVMLError_GpuIsLost: GPU is lost", "gpu_lost"),
    # https://github.com/AILab-CVC/YOLO-World/issues/385 and https://github.com/pytorch/pytorch/issues/2704
    ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", "busy"),
    (
        "RuntimeError: cuda runtime error (46) : all CUDA-capable devices are busy or unavailable at "
        "/opt/conda/conda-bld/pytorch_1502004572321/work/torch/lib/THC/generic/THCStorage.cu:66",
        "busy",
    ),
    # https://github.com/sgl-project/sglang/issues/3470; the lab's simulator prints torch 2.9's class
    ("RuntimeError: CUDA error: invalid device ordinal", "missing_gpu"),
    ("torch.AcceleratorError: CUDA error: invalid device ordinal", "missing_gpu"),
]

# lines that are no exception but say why a later crash happened, as the tools print them
HINT_LINES = [
    # https://github.com/mozilla/translations/issues/1167 (nvidia-smi's output)
    ("Failed to initialize NVML: Driver/library version mismatch", "driver_mismatch"),
    # https://github.com/CFSworks/nvml_fix/issues/36
    (
        "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest "
        "NVIDIA driver is installed and running.",
        "no_driver",
    ),
    # https://github.com/JosephKJ/OWOD/issues/81
    (
        "Unable to determine the device handle for GPU 0000:02:00.0: GPU is lost. Reboot the system to recover "
        "this GPU",
        "gpu_lost",
    ),
    # https://github.com/NVIDIA/open-gpu-kernel-modules/issues/1151 (the kernel's log)
    ("NVRM: Xid (PCI:0000:06:00): 79, GPU has fallen off the bus.", "gpu_lost"),
    # https://github.com/RIDE-Lab/SAGE/issues/185 (a container that lost its device access)
    ("Failed to initialize NVML: Unknown Error", "no_device"),
    # https://github.com/dmlc/gluon-nlp/pull/1512 (PyTorch's warning at torch.cuda.is_available())
    (
        "/root/.local/lib/python3.6/site-packages/torch/cuda/__init__.py:52: UserWarning: CUDA initialization: "
        "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver from "
        "http://www.nvidia.com/Download/index.aspx (Triggered internally at  /pytorch/c10/cuda/CUDAFunctions.cpp:100.)",
        "no_driver",
    ),
    # https://github.com/zhanghang1989/PyTorch-Encoding/issues/368
    (
        "/home/mona/venv/torchenc/lib/python3.8/site-packages/torch/cuda/__init__.py:52: UserWarning: CUDA "
        "initialization: CUDA unknown error - this may be due to an incorrectly set up environment, e.g. changing "
        "env variable CUDA_VISIBLE_DEVICES after program start. Setting the available devices to be zero. (Triggered "
        "internally at  /pytorch/c10/cuda/CUDAFunctions.cpp:100.)",
        "no_device",
    ),
]

FAULT_LINES = [
    # https://github.com/verl-project/verl/issues/1695 (an SGLang scheduler inside verl)
    "RuntimeError: CUDA error: unspecified launch failure",
    # https://github.com/liunian-Jay/MU-GOT/issues/7
    "RuntimeError: CUDA error: unknown error",
    # the CUDA runtime's string for cudaErrorECCUncorrectable, in PyTorch's "CUDA error: " form
    "torch.AcceleratorError: CUDA error: uncorrectable ECC error encountered",
]

# what each reason's advice must name: how to see it and what fixes it
ADVICE_NAMES = {
    "no_device": ("ls -l /dev/nvidia*", "nvidia-uvm-devices.service", "DeviceAllow=", "restart sglang.service"),
    "no_cuda": ("torch.version.cuda", "nvidia-smi", "warning above"),
    "no_driver": ("lsmod | grep nvidia", "modprobe nvidia", "dkms status", "mokutil"),
    "driver_mismatch": ("/proc/driver/nvidia/version", "reboot", "pinned"),
    "fabric_manager": ("nvidia-fabricmanager", "802"),
    "gpu_lost": ("Xid 79", "reboot"),
    "busy": ("Exclusive_Process", "nvidia-smi -c DEFAULT", "systemctl cat sglang.service"),
    "missing_gpu": ("nvidia-smi -L", "/dev/nvidia[0-9]*", "deploy run again"),
}


def _text(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


@pytest.mark.parametrize(("line", "reason"), EXCEPTION_LINES, ids=[r for _, r in EXCEPTION_LINES])
def test_an_exception_line_names_the_gpus_unavailable_and_why(line, reason):
    verdict = classify([MARKER, line])
    assert (verdict.state, verdict.cause, verdict.line, verdict.final) == ("crashed", "gpu_unavailable", line, True)
    assert gpu_reason(line) == reason
    assert verdict.advice == advice_for("crashed", cause="gpu_unavailable", reason=reason)


@pytest.mark.parametrize(("line", "reason"), EXCEPTION_LINES[:1] + EXCEPTION_LINES[6:7])
def test_it_decides_without_a_failure_marker_too(line, reason):
    """The launcher's own traceback (log 46) has no SGLang marker: the line is decisive on its own."""
    follower = LogFollower(started_at=0.0)
    verdict = follower.feed(line)
    assert (verdict.state, verdict.cause, verdict.final) == ("crashed", "gpu_unavailable", True)


@pytest.mark.parametrize(("line", "reason"), HINT_LINES, ids=[r for _, r in HINT_LINES])
def test_a_warning_before_a_crash_that_says_nothing_names_the_reason(line, reason):
    """nvidia-smi's error or PyTorch's CUDA warning, then a child that fails with no exception line of its own."""
    verdict = classify([line, SIGQUIT])
    assert (verdict.state, verdict.cause, verdict.line) == ("crashed", "gpu_unavailable", SIGQUIT)
    assert gpu_reason(line) == reason
    assert verdict.advice == advice_for("crashed", cause="gpu_unavailable", reason=reason)


@pytest.mark.parametrize(("line", "reason"), HINT_LINES)
def test_such_a_warning_alone_does_not_fail_a_start(line, reason):
    lines = [line, "[2026-04-02 07:41:59] The server is fired up and ready to roll!"]
    assert classify(lines).state == "ready"


def test_a_specific_reason_read_earlier_explains_a_vague_exception_line():
    """CUDA error 803 in PyTorch's warning, then SGLang's "No accelerator": the host's driver was updated."""
    warning = (
        "/opt/sglang/venv/lib/python3.12/site-packages/torch/cuda/__init__.py:182: UserWarning: CUDA initialization: "
        "Unexpected error from cudaGetDeviceCount(). Did you run some cuda functions before calling NumCudaDevices() "
        "that might have already set an error? Error 803: system has unsupported display driver / cuda driver "
        "combination (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:119.)"
    )
    vague = "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) is available."
    verdict = classify(
        [
            warning,
            "  return torch._C._cuda_getDeviceCount() > 0",
            "Traceback (most recent call last):",
            '  File "/x/sglang/srt/utils/common.py", line 1853, in get_device',
            vague,
        ]
    )
    assert (verdict.cause, verdict.line) == ("gpu_unavailable", vague)
    assert verdict.advice == advice_for("crashed", cause="gpu_unavailable", reason="driver_mismatch")


def test_a_specific_exception_line_is_not_overruled_by_an_earlier_warning():
    closed = "Failed to initialize NVML: Unknown Error"
    lost = "NVMLError_GpuIsLost: GPU is lost"
    assert gpu_reason(lost, closed) == "gpu_lost"
    assert classify([closed, MARKER, lost]).advice == advice_for("crashed", cause="gpu_unavailable", reason="gpu_lost")


# moefleet's own device check before a start (the unit's ExecStartPre, files/sglang-device-check), as journalctl
# -u sglang.service shows it with systemd's lines after it
DEVICE_CHECK = [
    "Apr 02 06:58:03.100211 gpu-01 sglang-device-check[1870]: sglang.service refuses to start: the NVIDIA device "
    "node /dev/nvidia-uvm is missing, and the unit allows only nodes that exist when it starts (CUDA cannot make "
    "them under NoNewPrivileges=). nvidia-uvm-devices.service makes them at boot: read 'systemctl status "
    "nvidia-uvm-devices.service' and 'journalctl -b -u nvidia-uvm-devices.service', start it ('systemctl start "
    "nvidia-uvm-devices.service', or run the nvidia_driver role, which installs it), then 'systemctl restart "
    "sglang.service'.",
    "Apr 02 06:58:03.100422 gpu-01 systemd[1]: sglang.service: Control process exited, code=exited, status=1/FAILURE",
    "Apr 02 06:58:03.100633 gpu-01 systemd[1]: sglang.service: Failed with result 'exit-code'.",
]


@pytest.mark.parametrize("nodes", ["node /dev/nvidia-uvm is", "nodes /dev/nvidia-uvm, /dev/nvidia-uvm-tools are"])
def test_the_device_check_refusing_a_start_decides_at_once(nodes):
    lines = [DEVICE_CHECK[0].replace("node /dev/nvidia-uvm is", nodes), *DEVICE_CHECK[1:]]
    follower = LogFollower(started_at=0.0)
    verdict = follower.feed(lines[0])
    assert (verdict.state, verdict.phase, verdict.cause, verdict.final) == (
        "crashed",
        "launch",
        "gpu_unavailable",
        True,
    )
    assert verdict.advice == advice_for("crashed", cause="gpu_unavailable", reason="no_device")
    assert classify(lines) == verdict


def test_the_device_checks_own_sentence_is_the_one_the_classifier_knows(tmp_path):
    """Run the unit's check itself (roles/sglang_service/files/sglang-device-check) with a node missing: its
    output, as the journal shows it, is classified gpu_unavailable, so the two cannot drift apart."""
    import subprocess  # noqa: PLC0415

    script = REPO / "roles" / "sglang_service" / "files" / "sglang-device-check"
    run = subprocess.run(["sh", str(script), "/dev/null", str(tmp_path / "nvidia3")], capture_output=True, text=True)
    assert run.returncode == 1 and str(tmp_path / "nvidia3") in run.stderr
    line = f"Apr 02 06:58:03.100211 gpu-01 sglang-device-check[1870]: {run.stderr.strip()}"
    verdict = classify([line, *DEVICE_CHECK[1:]])
    assert (verdict.state, verdict.cause) == ("crashed", "gpu_unavailable"), verdict


@pytest.mark.parametrize("line", FAULT_LINES)
def test_a_gpu_that_fails_running_a_kernel_is_a_gpu_fault(line):
    verdict = classify([MARKER, line])
    assert (verdict.state, verdict.cause) == ("crashed", "gpu_fault")
    assert "journalctl -k | grep -i xid" in verdict.advice and "Xid 79" in verdict.advice


@pytest.mark.parametrize(
    "line",
    [
        # a kernel bug, not the GPU: kept out of gpu_fault on purpose
        "RuntimeError: CUDA error: an illegal memory access was encountered",
        # SGLang 0.5.10's warning before it re-raises a set_device failure: no reason in it
        "[2026-04-02 07:41:28 TP3] Context: self.device='cuda' self.gpu_id=3 "
        "os.environ.get('CUDA_VISIBLE_DEVICES')=None self.tp_rank=3 self.tp_size=8",
    ],
)
def test_lines_that_say_nothing_about_the_gpus_are_not_gpu_causes(line):
    assert classify([MARKER, line]).cause == "other"


def test_the_driver_cause_is_still_a_driver_that_does_not_fit():
    """Log 31: cudaErrorInsufficientDriver, the driver is older than the CUDA runtime: the 570+ advice."""
    verdict = classify(_text("31-crash_other-driver-cudaErrorInsufficientDriver-scheduler.log"))
    assert verdict.cause == "driver" and "570" in verdict.advice


def test_the_incident_log_is_gpus_unavailable_with_the_device_node_advice():
    """Log 45: before, 'crashed (other)'. Every failing rank says the same; the first one decides."""
    text = _text(UVM_LOG)
    verdict = classify(text)
    assert (verdict.state, verdict.phase, verdict.cause, verdict.rank) == (
        "crashed",
        "nccl_init",
        "gpu_unavailable",
        "TP3",
    )
    assert verdict.line.startswith("RuntimeError: CUDA unknown error")
    assert verdict.advice == advice_for("crashed", cause="gpu_unavailable", reason="no_device")
    assert verdict.oom is None


def test_the_launcher_log_takes_its_reason_from_pytorchs_warning():
    """Log 46: the deciding line only says no accelerator; the CUDA warning 30 lines above says why."""
    verdict = classify(_text(LAUNCHER_LOG))
    assert (verdict.state, verdict.phase, verdict.cause, verdict.rank) == ("crashed", "launch", "gpu_unavailable", None)
    assert verdict.line.startswith("RuntimeError: No accelerator")
    assert verdict.advice == advice_for("crashed", cause="gpu_unavailable", reason="no_device")


@pytest.mark.parametrize("reason", GPU_REASONS)
def test_each_reason_has_its_own_advice_that_names_what_to_check(reason):
    advice = advice_for("crashed", cause="gpu_unavailable", reason=reason)
    others = {advice_for("crashed", cause="gpu_unavailable", reason=r) for r in GPU_REASONS if r != reason}
    assert advice not in others
    assert advice != advice_for("crashed", cause="other")
    for name in ADVICE_NAMES[reason]:
        assert name in advice, (reason, name)
    # not a memory problem: nothing here may point at the memory flags or the fallback layouts
    assert not re.search(r"mem-fraction|fallback|smaller layout|--cuda-graph-max-bs", advice)


def test_every_reason_has_patterns_and_every_gpu_reason_is_known():
    assert set(ADVICE_NAMES) == set(GPU_REASONS)
    assert {reason for _, reason in EXCEPTION_LINES + HINT_LINES} == set(GPU_REASONS)
    assert advice_for("crashed", cause="gpu_unavailable") != advice_for("crashed", cause="other")


@pytest.mark.parametrize("cause", [c for c in CAUSES if c != "other"])
def test_every_cause_has_advice_of_its_own(cause):
    assert advice_for("crashed", cause=cause) != advice_for("crashed", cause="other")


def test_the_readiness_module_documents_every_cause():
    doc = (REPO / "plugins" / "modules" / "sglang_readiness.py").read_text(encoding="utf-8")
    for cause in CAUSES:
        assert f"C({cause})" in doc, cause


def test_the_readme_troubleshooting_table_quotes_the_gpu_advice():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Troubleshooting by symptom", 1)[1].split("\n## ", 1)[0]
    section = section.replace("\\|", "|")  # a | inside a table cell is written \|
    for reason in GPU_REASONS:
        assert advice_for("crashed", cause="gpu_unavailable", reason=reason) in section, reason
    assert advice_for("crashed", cause="gpu_fault") in section


@pytest.mark.parametrize("name", [UVM_LOG, LAUNCHER_LOG])
def test_the_rollback_restores_and_falls_back_to_no_smaller_profile(name):
    """What the classifier says feeds the rollback: a host with no usable GPU is no memory problem."""
    verdict = classify(_text(name))
    outcome = {"state": verdict.state, "phase": verdict.phase, "cause": verdict.cause}
    attempt = {**rollback.first_attempt("tp8", "pcie_p2p"), "outcome": outcome}
    catalog = {"profiles": {"tp8": {"nccl": "pcie_p2p"}, "tp4ep2": {"nccl": "pcie_p2p"}}}
    step = rollback.next_step(["tp8", "tp4ep2"], [attempt], catalog, release="0.5.10")
    assert step["action"] == "restore" and "attempt" not in step
    assert "gpu_unavailable" in step["reason"] and "needs the GPUs too" in step["reason"]
