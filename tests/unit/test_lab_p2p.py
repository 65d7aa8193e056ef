"""sim/lab/lab.py's part in the P2P simulation: what `up` installs on a host (the PCIe model, lspci, the boot unit that
gives each boot its id and kernel lines) and `lab.py p2p`, whose options are the model's own (sim/gpu/pcie_sim.py)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from types import SimpleNamespace

from playbook import lab_module

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "sim" / "gpu"))
import pcie_sim  # noqa: E402


def recorded(monkeypatch, lab, stdout="{}"):
    ran = []

    def podman(*args, **kw):
        ran.append(args)
        return SimpleNamespace(returncode=0, stdout=stdout, stderr="")

    monkeypatch.setattr(lab, "podman", podman)
    monkeypatch.setattr(lab, "lab_containers", lambda *a: {"moefleet-lab-1": {"State": "running"}})
    return ran


def test_up_installs_the_pcie_model_and_the_boot_unit_and_restores_the_default(monkeypatch):
    lab = lab_module()
    ran = recorded(monkeypatch, lab)
    lab.prepare_host("moefleet-lab-1")
    copied = [args[2].split(":", 1)[1] for args in ran if args[0] == "cp"]
    assert copied == [*(f"/usr/local/lib/moefleet-sim/{f}" for f in ("pci_tree.py", "pcie_sim.py", "p2p_backend.py",
                                                                      "lspci")),
                      "/usr/lib/python3/dist-packages/moefleet_lab_ansiballz_bytecode.py"]
    pth = next(args for args in ran if "/usr/lib/python3/dist-packages/moefleet_lab_ansiballz_bytecode.pth" in args)
    assert pth[-1] == "import moefleet_lab_ansiballz_bytecode\n"  # site runs a .pth line that starts with import
    assert all(Path(args[1]).is_file() for args in ran if args[0] == "cp")
    unit = next(args for args in ran if "/etc/systemd/system/moefleet-lab-boot.service" in args)[-1]
    assert "cat /proc/sys/kernel/random/uuid > /run/sim-gpu/boot_id" in unit
    assert "systemd-cat -t kernel -p info < /etc/sim-gpu/kernel-boot.log" in unit
    links = next(args[-1] for args in ran if "ln -sf /usr/local/lib/moefleet-sim/lspci /usr/bin/lspci" in args[-1])
    assert "multi-user.target.wants" in links
    reset = next(args for args in ran if "set" in args and "--reset" in args)
    assert reset[reset.index("--bus-ids") + 1].split(",")[0] == "00000000:01:00.0"
    assert ran[-1] == ("exec", "moefleet-lab-1", "systemctl", "restart", "moefleet-lab-boot.service")


def test_lab_p2p_options_are_the_models_and_set_what_they_say(tmp_path):
    lab = lab_module()
    args = argparse.Namespace(reset=True, topology="one-switch", acs="srcvalid", iommu="passthrough", bar1="256M",
                              after_hang="busy", acs_bridge=["0000:11:08.0=redirect"])
    options = lab.p2p_options(args)
    assert options[:3] == ["--reset", "--topology", "one-switch"] and "--after-hang" in options
    assert pcie_sim.main(["set", str(tmp_path), *options]) == 0
    state = json.loads((tmp_path / "p2p.json").read_text())
    assert state == {"topology": "one-switch", "acs": "srcvalid", "acs_bridges": {"0000:11:08.0": "redirect"},
                     "iommu": "passthrough", "bar1": "256M", "after_hang": "busy"}
    assert (tmp_path / "cmdline").read_text().rstrip().endswith(" iommu=pt")


def test_lab_p2p_writes_the_new_boots_kernel_lines_or_reboots(monkeypatch):
    lab = lab_module()
    ran = recorded(monkeypatch, lab, stdout='{"acs": "redirect"}')
    rebooted = []
    monkeypatch.setattr(lab, "reboot", rebooted.append)
    lab.set_p2p("lab-1", ["--acs", "redirect"])
    assert ran[0][:6] == ("exec", "moefleet-lab-1", "python3", "/usr/local/lib/moefleet-sim/pcie_sim.py", "set",
                          "/etc/sim-gpu")
    assert "systemd-cat -t kernel" in ran[1][-1] and rebooted == []
    lab.set_p2p("lab-1", ["--iommu", "off"], reboot_after=True)
    assert rebooted == ["lab-1"] and len(ran) == 3
