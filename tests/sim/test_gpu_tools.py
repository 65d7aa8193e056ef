"""nvidia-smi and nvcc stand-ins, and the lab's model directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from conftest import K26_CONFIG, MAKE_MODEL_DIR, NVCC


def hold(lab, mib_by_gpu: dict[int, int], name: str = "python3") -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    rec = {"pid": proc.pid, "process_name": name, "used_mib": {str(g): m for g, m in mib_by_gpu.items()}}
    (lab.state / f"{proc.pid}.json").write_text(json.dumps(rec))
    return proc


def test_query_gpu_formats(lab):
    out = lab.smi("--query-gpu=index,name,memory.total,memory.used,memory.free,driver_version,compute_cap,"
                  "pci.bus_id,persistence_mode", "--format=csv").stdout.splitlines()
    assert out[0] == ("index, name, memory.total [MiB], memory.used [MiB], memory.free [MiB], driver_version, "
                      "compute_cap, pci.bus_id, persistence_mode")
    assert out[1] == ("0, NVIDIA RTX PRO 6000 Blackwell Server Edition, 97887 MiB, 0 MiB, 97249 MiB, 580.95.05, 12.0, "
                      "00000000:01:00.0, Enabled")
    assert len(out) == 9
    assert lab.smi("--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "3").stdout == "97887\n"
    assert lab.smi("--query-gpu=count", "--format=csv,noheader").stdout.splitlines()[0] == "8"


def test_list_topo_table_and_errors(lab):
    lines = lab.smi("-L").stdout.splitlines()
    assert len(lines) == 8 and lines[0].startswith("GPU 0: NVIDIA RTX PRO 6000 Blackwell Server Edition (UUID: GPU-")
    topo = lab.smi("topo", "-m").stdout
    # The default tree (sim/gpu/pci_tree.py): a PCIe switch per socket, so PIX within a socket and SYS across.
    assert "NV" not in topo.split("Legend")[0] and "PIX" in topo and "SYS" in topo
    table = lab.smi().stdout
    assert "Driver Version: 580.95.05" in table and "CUDA Version: 13.0" in table
    assert "0MiB /  97887MiB" in table and "No running processes found" in table
    assert {len(x) for x in table.splitlines()[1:] if x} == {91}
    bad = lab.smi("--frobnicate", check=False)
    assert bad.returncode != 0 and "Please run 'nvidia-smi -h' for help." in bad.stdout
    bad = lab.smi("--query-gpu=bogus", "--format=csv", check=False)
    assert bad.returncode != 0 and 'Field "bogus" is not a valid field to query.' in bad.stdout


def test_memory_follows_live_processes(lab):
    p = hold(lab, {0: 81622, 3: 1024}, "sglang::scheduler_TP0")
    try:
        used = lab.used_mib()
        assert used[0] == 81622 and used[3] == 1024 and used[1] == 0
        free = lab.smi("--query-gpu=memory.free", "--format=csv,noheader,nounits", "-i", "0").stdout.strip()
        assert int(free) == 97249 - 81622
        assert [str(p.pid), "sglang::scheduler_TP0", "81622 MiB"] in lab.apps()
        table = lab.smi().stdout
        assert "sglang::scheduler_TP0" in table and "81622MiB" in table
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    time.sleep(0.05)
    assert lab.used_mib() == [0] * 8 and lab.apps() == []  # a killed process frees its memory


def test_nvcc_version_from_path_or_env(tmp_path):
    out = subprocess.run([sys.executable, str(NVCC), "--version"], capture_output=True, text=True,
                         env=dict(os.environ, SIM_CUDA_VERSION="")).stdout
    assert "Cuda compilation tools, release 12.9, V12.9.86" in out
    d = tmp_path / "cuda-12.8" / "bin"
    d.mkdir(parents=True)
    (d / "nvcc").write_text(NVCC.read_text())
    env = {k: v for k, v in os.environ.items() if k != "SIM_CUDA_VERSION"}
    out = subprocess.run([sys.executable, str(d / "nvcc"), "--version"], capture_output=True, text=True,
                         env=env).stdout
    assert "release 12.8, V12.8.93" in out


def test_model_dir_is_sparse_and_matches_the_checkpoint(tmp_path):
    dest = tmp_path / "Kimi-K2.6"
    run = [sys.executable, str(MAKE_MODEL_DIR), str(dest)]
    first = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    assert first["shards"] == 64 and first["tensors"] == 208550 and first["changed"]
    assert first["total_size"] == 595_148_192_736  # 554.27 GiB, the released tensor list
    again = json.loads(subprocess.run(run, capture_output=True, text=True, check=True).stdout)
    assert not again["changed"]
    index = json.loads((dest / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == first["total_size"]
    assert index["weight_map"]["language_model.lm_head.weight"] == "model-00062-of-000064.safetensors"
    shards = sorted(dest.glob("model-*.safetensors"))
    assert len(shards) == 64
    apparent = sum(s.stat().st_size for s in shards)
    on_disk = sum(s.stat().st_blocks * 512 for s in shards)
    assert apparent > first["total_size"] and on_disk < 200 * 2**20
    assert json.loads((dest / "config.json").read_text()) == json.loads(K26_CONFIG.read_text())
