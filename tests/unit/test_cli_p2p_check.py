"""moefleet p2p-check: what it prints per file, the combined verdict, exit codes (0 pcie_p2p, 1 pcie_shm, 2 an input
cannot be read, 3 unknown), --json, stdin and --gpus, on the corpus in tests/data/p2p."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from moefleet.cli import main

DATA = Path(__file__).resolve().parents[1] / "data" / "p2p"
REDIRECT = DATA / "lkml-20250701-lspci-root-ports-redirect.txt"
TRANSLATED = DATA / "synthetic-dmesg-amd-vi-translated.txt"
PASSTHROUGH = DATA / "gardenlinux-4556-cmdline-iommu-pt.txt"


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["p2p-check", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_hang_state_exits_1_with_reason_and_fix(capsys):
    code, out, err = _run(capsys, REDIRECT, TRANSLATED)
    assert code == 1 and err == ""
    assert f"{REDIRECT}:\n  lspci (vvv): 2 bridge(s) with ACS, redirect on 0000:00:01.1, 0000:00:01.2" in out
    assert f"{TRANSLATED}:\n  kernel: IOMMU translating" in out
    assert "verdict: pcie_shm" in out
    assert "setpci -s 0000:00:01.1 ECAP_ACS+0x6.w=0000:000c" in out
    assert "rules:" in out and "acs-redirect-iommu-translating" in out


def test_redirect_with_passthrough_exits_0(capsys):
    code, out, _ = _run(capsys, REDIRECT, PASSTHROUGH)
    assert code == 0 and "verdict: pcie_p2p" in out


def test_healthy_bandwidth_exits_0_and_broken_exits_1(capsys):
    assert _run(capsys, DATA / "stelline-esc8000a-p2pbandwidth-sys-pairs.txt")[0] == 0
    code, out, _ = _run(capsys, DATA / "aikitoria-9-p2pbandwidth-rebar-off.txt")
    assert code == 1 and "bandwidth-broken" in out


def test_unknown_exits_3_and_names_what_is_missing(capsys):
    code, out, _ = _run(capsys, DATA / "rtx6kpro-15-topo-m-phb.txt")
    assert code == 3
    assert "verdict: unknown" in out and "missing:" in out and "sudo lspci -vvv" in out


def test_an_unreadable_file_exits_2_and_the_others_are_still_judged(capsys, tmp_path):
    junk = tmp_path / "notes.txt"
    junk.write_text("my GPUs are slow, any idea?\n")
    code, out, err = _run(capsys, junk, REDIRECT, TRANSLATED)
    assert code == 2
    assert f"moefleet p2p-check: {junk}: no nvidia-smi topo" in err
    assert "verdict: pcie_shm" in out  # the verdict of the files it could read


def test_missing_file_and_directory_exit_2(capsys, tmp_path):
    code, out, err = _run(capsys, tmp_path / "nope.txt")
    assert code == 2 and "nope.txt: no such file." in err and "verdict" not in out
    code, _, err = _run(capsys, tmp_path)
    assert code == 2 and "is a directory" in err


def test_json_shape(capsys):
    code, out, _ = _run(capsys, REDIRECT, TRANSLATED, "--json")
    result = json.loads(out)
    assert code == 1
    assert [entry["file"] for entry in result["files"]] == [str(REDIRECT), str(TRANSLATED)]
    assert result["files"][0]["kinds"] == ["lspci"] and result["files"][0]["evidence"][0]["kind"] == "lspci"
    verdict = result["verdict"]
    assert verdict["verdict"] == "pcie_shm" and verdict["rules"][0] == "acs-redirect-iommu-translating"
    assert verdict["acs"]["redirect_bridges"] == ["0000:00:01.1", "0000:00:01.2"]
    assert verdict["iommu"]["mode"] == "translated"
    assert verdict["rule_table"]["acs-redirect-iommu-translating"]["source"].startswith("NVIDIA/nccl#2079")


def test_json_for_an_unreadable_file(capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    code, out, _ = _run(capsys, empty, "--json")
    assert code == 2
    assert json.loads(out) == {"files": [{"file": str(empty), "error": "it is empty."}], "verdict": None}


def test_stdin(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO((DATA / "club-3090-1124-topo-p2p-rw-gns.txt")
                                                                  .read_bytes())))
    code, out, _ = _run(capsys, "-")
    assert code == 1 and out.startswith("stdin:\n  nvidia-smi topo -p2p: 2 GPUs, not OK: GNS (GPU not supported)")


def test_gpus_limits_the_pairs(capsys):
    assert _run(capsys, DATA / "club-3090-1124-topo-p2p-rw-gns.txt", "--gpus", "0,1")[0] == 1
    assert _run(capsys, DATA / "club-3090-1124-topo-p2p-rw-gns.txt", "--gpus", "2,3")[0] == 3


@pytest.mark.parametrize("value", ["0", "a,b", "-1,0"])
def test_bad_gpus_exits_2(capsys, value):
    code, _, err = _run(capsys, REDIRECT, f"--gpus={value}")
    assert code == 2 and "give e.g. --gpus 0,1" in err


def test_help_states_the_exit_codes(capsys):
    with pytest.raises(SystemExit) as done:
        main(["p2p-check", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for phrase in ("0 P2P is fine (pcie_p2p)", "1 shared memory is advised (pcie_shm)",
                   "2 an input cannot be read", "3 the evidence decides nothing"):
        assert phrase in text
