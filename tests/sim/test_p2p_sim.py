"""The lab's PCIe peer-to-peer simulation (sim/gpu/pcie_sim.py): the lspci stand-in, nvidia-smi's topology and stuck
GPUs, and the all-reduce the preflight's check runs through the stand-in backend (sim/gpu/p2p_backend.py), in each
state the lab sets: healthy, the hang state, its harmless neighbours, and the GPUs a hang leaves stuck."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pci_tree
import pcie_sim
import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import p2p_evidence as p2p
from conftest import NVIDIA_SMI, ROOT

LSPCI = ROOT / "sim" / "gpu" / "lspci"
CHECK = ROOT / "roles" / "sglang_service" / "files" / "p2p-allreduce-check"
BACKEND = ROOT / "sim" / "gpu" / "p2p_backend.py"
P2P = {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "SYS", "NCCL_ALGO": "Ring"}
SHM = {"NCCL_IB_DISABLE": "1", "NCCL_P2P_DISABLE": "1", "NCCL_ALGO": "Ring"}


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A simulated host's hardware root (SIM_GPU_ROOT) and boot state (SIM_GPU_RUN_DIR), in the healthy default."""
    root, run = tmp_path / "etc-sim-gpu", tmp_path / "run"
    root.mkdir()
    monkeypatch.setenv("SIM_GPU_ROOT", str(root))
    monkeypatch.setenv("SIM_GPU_RUN_DIR", str(run))
    monkeypatch.setenv("SIM_GPU_SPEC", str(tmp_path / "gpus.json"))
    monkeypatch.setenv("SIM_GPU_STATE_DIR", str(tmp_path / "procs"))
    monkeypatch.setenv("SIM_LSPCI_USER", "root")  # lspci as the preflight runs it (become)
    for var in [v for v in os.environ if v.startswith("NCCL_")]:
        monkeypatch.delenv(var, raising=False)

    def set_state(**changes):
        state = dict(json.loads(json.dumps(pcie_sim.DEFAULT_STATE)), **changes)
        return pcie_sim.write_state(str(root), state, pci_tree.gpu_bus_ids())

    set_state()
    return root, run, set_state


def tool(path, *args, env=None, check=True):
    done = subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, **(env or {})))
    if check:
        assert done.returncode == 0, done.stdout + done.stderr
    return done


def allreduce(gpus, env, collective_timeout=2.0, size_mib=256, backend=BACKEND):
    """p2p-allreduce-check with the stand-in backend, as the preflight runs it; its JSON line and its wall time."""
    started = time.monotonic()
    base = {k: v for k, v in os.environ.items() if not k.startswith("NCCL_")}
    done = subprocess.run([sys.executable, str(CHECK), "--gpus", ",".join(map(str, gpus)), "--label", "t",
                           "--size-mib", str(size_mib), "--iters", "3", "--warmup", "1", "--start-timeout", "30",
                           "--collective-timeout", str(collective_timeout), "--backend", str(backend)],
                          capture_output=True, text=True, timeout=60, env=dict(base, **env))
    return json.loads(done.stdout.strip().splitlines()[-1]), time.monotonic() - started, done.returncode


def static(root, *, gpus=None):
    """decide() over what the host shows: lspci -vvv and -tv, its command line, /sys/class/iommu, its kernel lines."""
    items = p2p.parse_lspci(tool(LSPCI, "-vvv").stdout + tool(LSPCI, "-tv").stdout)
    items += p2p.parse_iommu((root / "cmdline").read_text())
    items += p2p.parse_iommu((root / "kernel-boot.log").read_text())
    items.append(p2p.sysfs_iommu_evidence(os.listdir(root / "sys" / "class" / "iommu")))
    return p2p.decide(items, gpus)


# --- the tree and lspci -----------------------------------------------------------------------------------------------


def test_lspci_tree_draws_the_two_socket_tree_as_pciutils_does(host):
    tree = tool(LSPCI, "-tv").stdout.splitlines()
    assert tree[0] == ("-+-[0000:00]-+-01.1-[10-61]----00.0-[11-61]--+-00.0-[01]----00.0  "
                       "NVIDIA Corporation Device 2bb5")
    assert tree[1] == " |           |                               +-08.0-[21]----00.0  NVIDIA Corporation Device 2bb5"
    assert tree[4] == " |           \\-03.1-[05]----00.0  Samsung Electronics Co Ltd Device a80c"
    assert tree[5].startswith(" \\-[0000:80]-+-01.1-[90-e1]----00.0-[91-e1]--+-00.0-[81]----00.0  NVIDIA")
    (item,) = p2p.parse_lspci("\n".join(tree))
    above = {gpu["bdf"]: gpu["bridges_above"] for gpu in item["gpus"]}
    # GPU 0's bus (01) sits below bridges numbered higher (nvidia-smi's bus ids are fixed): the tree still places it.
    assert above["0000:01:00.0"] == ["0000:00:01.1", "0000:10:00.0", "0000:11:00.0"]
    assert above["0000:a1:00.0"] == ["0000:80:01.1", "0000:90:00.0", "0000:91:08.0"]
    assert len(above) == 8


def test_lspci_vvv_shows_acs_per_bridge_and_only_to_root(host):
    root, _, set_state = host
    set_state(acs="srcvalid", acs_bridges={"0000:11:08.0": "redirect"})
    text = tool(LSPCI, "-vvv").stdout
    block = text.split("\n\n")[[b.startswith("11:08.0 ") for b in text.split("\n\n")].index(True)]
    assert "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-" in block
    assert "\tBus: primary=11, secondary=21, subordinate=21, sec-latency=0" in block
    (item,) = p2p.parse_lspci(text)
    acs = {b["bdf"]: b["acs_ctl"] for b in item["bridges"]}
    assert acs["0000:10:00.0"] is None  # a switch's upstream port has no ACS
    assert acs["0000:00:01.1"] == {"SrcValid": True, "TransBlk": False, "ReqRedir": False, "CmpltRedir": False,
                                   "UpstreamFwd": False, "EgressCtrl": False, "DirectTrans": False}
    assert [b["bdf"] for b in item["bridges"] if b["redirect"]] == ["0000:11:08.0"]
    gpu = next(g for g in item["gpus"] if g["bdf"] == "0000:21:00.0")
    assert gpu["bar1_bytes"] == 128 << 30 and "IOMMU group:" in text
    denied = tool(LSPCI, "-vvv", env={"SIM_LSPCI_USER": "user"}).stdout
    assert "ACSCtl" not in denied and "\tCapabilities: <access denied>" in denied
    assert tool(LSPCI, "-s", "21:00.0").stdout == "21:00.0 3D controller: NVIDIA Corporation Device 2bb5 (rev a1)\n"


def test_one_switch_puts_every_gpu_under_one_switch_and_replaces_the_old_tree(host):
    root, _, set_state = host
    set_state(topology="one-switch", iommu="off", bar1="256M")
    devices = sorted(p.name for p in (root / "sys" / "bus" / "pci" / "devices").iterdir())
    assert not [d for d in devices if d.startswith("0000:9")]  # the second socket's switch is gone
    (item,) = p2p.parse_lspci(tool(LSPCI, "-vvv").stdout + tool(LSPCI, "-tv").stdout)
    assert {tuple(g["bridges_above"][:2]) for g in item["gpus"]} == {("0000:00:01.1", "0000:10:00.0")}
    assert "IOMMU group" not in tool(LSPCI, "-vvv").stdout  # no IOMMU, no groups
    assert any("256 MiB BAR1" in note for note in item["notes"])
    assert (root / "cmdline").read_text().rstrip().endswith("amd_iommu=off")
    assert list((root / "sys" / "class" / "iommu").iterdir()) == []


def test_a_bridge_the_tree_has_not_is_refused_with_the_ones_it_has(host):
    root, _, _ = host
    done = subprocess.run([sys.executable, str(ROOT / "sim" / "gpu" / "pcie_sim.py"), "set", str(root),
                           "--acs-bridge", "0000:91:00.0=redirect", "--topology", "one-switch"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2
    assert "no bridge with ACS at 0000:91:00.0 in the one-switch tree" in done.stderr and "0000:11:38.0" in done.stderr


# --- nvidia-smi ---------------------------------------------------------------------------------------------------


def test_topo_follows_the_tree(host):
    _, _, set_state = host
    (two,) = p2p.parse_topo_matrix(tool(NVIDIA_SMI, "topo", "-m").stdout)
    links = {(pair["a"], pair["b"]): pair["link"] for pair in two["pairs"]}
    assert links[(0, 3)] == links[(4, 7)] == "PIX" and links[(0, 4)] == links[(3, 7)] == "SYS"
    set_state(topology="one-switch")
    (one,) = p2p.parse_topo_matrix(tool(NVIDIA_SMI, "topo", "-m").stdout)
    assert {pair["link"] for pair in one["pairs"]} == {"PIX"}


def test_topo_without_a_tree_is_the_default_trees(host, tmp_path):
    bare = tool(NVIDIA_SMI, "topo", "-m", env={"SIM_GPU_ROOT": str(tmp_path / "none")}).stdout
    written = tool(NVIDIA_SMI, "topo", "-m").stdout
    assert bare == written


def test_the_driver_says_ok_in_the_state_that_hangs(host):
    _, _, set_state = host
    set_state(acs="redirect")
    (matrix,) = p2p.parse_topo_p2p("$ nvidia-smi topo -p2p r\n" + tool(NVIDIA_SMI, "topo", "-p2p", "r").stdout)
    assert matrix["capability"] == "r" and matrix["not_ok"] == [] and len(matrix["gpus"]) == 8
    assert "NS" in tool(NVIDIA_SMI, "topo", "-p2p", "n").stdout
    missing = tool(NVIDIA_SMI, "topo", "-p2p", check=False)
    assert missing.returncode == 2 and missing.stdout == 'Option "-p2p" is missing its value.\n'


# --- the all-reduce -------------------------------------------------------------------------------------------------


def test_healthy_p2p_is_faster_than_shm_and_checks_its_data(host):
    run, _, code = allreduce([0, 1, 2, 3], P2P)
    assert code == 0 and (run["result"], run["data_check"]) == ("ok", True)
    assert run["busbw_gbps"] == pcie_sim.P2P_BUSBW["PIX"]  # the model's figure: the stand-in reports its time
    assert any("via P2P/CUMEM" in line for line in run["nccl_lines"])
    control, _, _ = allreduce([0, 1, 2, 3], SHM)
    assert control["busbw_gbps"] == pcie_sim.SHM_BUSBW < run["busbw_gbps"]
    assert any("via SHM/direct/direct" in line for line in control["nccl_lines"])
    assert control["env"]["NCCL_P2P_DISABLE"] == "1"


def test_cross_socket_pairs_are_slower_than_one_switch(host):
    _, _, set_state = host
    across, _, _ = allreduce(list(range(8)), P2P)
    set_state(topology="one-switch")
    switch, _, _ = allreduce(list(range(8)), P2P)
    assert (across["busbw_gbps"], switch["busbw_gbps"]) == (pcie_sim.P2P_BUSBW["SYS"], pcie_sim.P2P_BUSBW["PIX"])


@pytest.mark.parametrize("ranks", ["threads", "processes"])
def test_the_hang_state_hangs_and_is_killed_within_the_timeout(host, tmp_path, ranks):
    root, _, set_state = host
    set_state(acs="redirect")
    backend = BACKEND
    if ranks == "processes":  # the stand-in without RANKS = "threads": the check's process per rank, killed
        backend = tmp_path / "per_process_backend.py"
        backend.write_text(f"import sys\nsys.path.insert(0, {str(BACKEND.parent)!r})\n"
                           "from p2p_backend import open  # noqa: F401,A004\n")
    run, seconds, code = allreduce([0, 1, 2, 3], P2P, collective_timeout=2.0, backend=backend)
    assert (code, run["result"], run["phase"]) == (2, "hang", "collective")
    assert "4 of 4 rank(s) still in the all-reduce after 2.0 s" in run["error"]
    assert seconds < 2.0 + 8  # the workers' start plus the collective timeout, not more
    assert any("via P2P/CUMEM" in line for line in run["nccl_lines"])  # NCCL connected: the hang comes after
    control, _, _ = allreduce([0, 1, 2, 3], SHM)
    assert control["result"] == "ok"  # P2P off avoids it
    assert static(root, gpus=[0, 1, 2, 3])["rules"][0] == "acs-redirect-iommu-translating"


@pytest.mark.parametrize(("state", "rule"), [
    ({"acs": "srcvalid"}, "no-acs-redirect"),
    ({"acs": "redirect", "iommu": "passthrough"}, "acs-redirect-iommu-not-translating"),
    ({"acs": "redirect", "iommu": "off"}, "acs-redirect-iommu-not-translating"),
])
def test_the_states_next_to_the_hang_state_do_not_hang(host, state, rule):
    root, _, set_state = host
    set_state(**state)
    run, _, _ = allreduce([0, 1, 2, 3], P2P)
    assert (run["result"], run["data_check"]) == ("ok", True)
    if state["acs"] == "redirect":  # redirected up through the switch's shared uplink: slower, not stuck
        assert run["busbw_gbps"] == pcie_sim.REDIRECTED_BUSBW
    verdict = static(root, gpus=[0, 1, 2, 3])
    assert (verdict["verdict"], verdict["rules"][0]) == ("pcie_p2p", rule)


def test_redirect_off_the_pairs_path_does_not_hang(host):
    _, _, set_state = host
    set_state(acs_bridges={"0000:00:01.1": "redirect"})  # the root port: same-switch traffic never reaches it
    run, _, _ = allreduce([0, 1, 2, 3], P2P)
    assert run["result"] == "ok"
    across, _, _ = allreduce([2, 3, 4, 5], P2P)  # these pairs cross it
    assert across["result"] == "hang"


@pytest.mark.parametrize("mode", ["busy", "unresponsive"])
def test_a_hang_can_leave_the_gpus_stuck_until_a_reboot(host, mode):
    _, run_dir, set_state = host
    set_state(acs="redirect", after_hang=mode)
    run = allreduce([0, 1], P2P)[0]
    assert run["result"] == "hang", run
    query = ["--query-gpu=index,utilization.gpu,power.draw", "--format=csv,noheader,nounits"]
    smi = tool(NVIDIA_SMI, *query, check=False)
    if mode == "busy":
        rows = [line.split(", ") for line in smi.stdout.splitlines()]
        assert smi.returncode == 0 and rows[0] == ["0", "100", "139.82"] and rows[2] == ["2", "0", "41.57"]
        assert tool(NVIDIA_SMI, "--query-compute-apps=pid", "--format=csv,noheader").stdout == ""
        again, _, _ = allreduce([0, 1], SHM)
        assert again["result"] == "hang"  # GPUs spinning in the dead collective run nothing else
    else:
        assert smi.returncode == 255
        assert smi.stdout == ("Unable to determine the device handle for GPU 0000:01:00.0: Unknown Error\n"
                              "Unable to determine the device handle for GPU 0000:21:00.0: Unknown Error\n")
        again, _, code = allreduce([0, 1], SHM)
        assert (again["result"], code) == ("error", 1) and "CUDA error" in again["error"]
    for leftover in run_dir.iterdir():  # a reboot: /run is new
        leftover.unlink()
    assert tool(NVIDIA_SMI, *query).returncode == 0
    assert allreduce([0, 1], SHM)[0]["result"] == "ok"


def test_the_lab_faults_reach_the_stand_in(host):
    _, run_dir, _ = host
    run_dir.mkdir(exist_ok=True)
    (run_dir / "lost.json").write_text("[1]")
    lost, _, _ = allreduce([0, 1], P2P)
    assert lost["result"] == "error" and "rank 1" in lost["error"] and "fell off the bus" in lost["error"]
    (run_dir / "lost.json").unlink()
    (run_dir / "nccl-hang").touch()  # lab.py fault HOST hang: every collective hangs, P2P or not
    assert allreduce([0, 1], SHM)[0]["result"] == "hang"


def test_the_kernel_lines_of_each_iommu_state_read_as_that_state(host):
    root, _, set_state = host
    for mode, read in (("translated", "translated"), ("passthrough", "passthrough"), ("off", "off")):
        set_state(iommu=mode)
        merged = static(root)["iommu"]
        assert merged["mode"] == read, (mode, merged)
    # With the IOMMU off the kernel still prints "Default domain type: Translated"; alone it is no evidence.
    (alone,) = p2p.parse_iommu((root / "kernel-boot.log").read_text())
    assert alone["mode"] is None and "Translated" in (root / "kernel-boot.log").read_text()
