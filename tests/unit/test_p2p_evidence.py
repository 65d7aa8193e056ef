"""plugins/module_utils/p2p_evidence.py on the corpus of real outputs in tests/data/p2p (SOURCES.md: where each
comes from, what it shows, what it must read as): every file parses to the kinds and the verdict its row names, the
format messes (prompts, sudo lines, colour codes, CRLF, tabs, wrapped rows, cut legends) each have a case, unreadable
input is refused with a sentence, and the decision table holds both ways."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from ansible_collections.moefleet.serving.plugins.module_utils import p2p_evidence as p2p

DATA = Path(__file__).resolve().parents[1] / "data" / "p2p"


def text(name: str) -> str:
    return (DATA / name).read_text(encoding="utf-8")


def corpus_rows() -> list[tuple[str, list[str], str]]:
    """(file, kinds, verdict) of each row of SOURCES.md's Files table."""
    section = text("SOURCES.md").split("## Files", 1)[1].split("## Combinations", 1)[0]
    rows = []
    for line in section.splitlines():
        match = re.match(r"^\| `(?P<file>[^`]+)` \|.*\| (?P<kinds>[a-z_, 0-9]+) \| "
                         r"(?P<verdict>pcie_p2p|pcie_shm|unknown) \|$", line)
        if match:
            rows.append((match.group("file"), match.group("kinds").split(", "), match.group("verdict")))
    return rows


ROWS = corpus_rows()


def decide(*names: str, gpus=None) -> dict:
    evidence = []
    for name in names:
        evidence += p2p.read(text(name))
    return p2p.decide(evidence, gpus)


def test_sources_lists_every_corpus_file_and_nothing_else():
    listed = {name for name, _, _ in ROWS}
    assert listed == {path.name for path in DATA.glob("*.txt")}
    assert len([name for name in listed if not name.startswith("synthetic-")]) >= 12


@pytest.mark.parametrize(("name", "kinds", "verdict"), ROWS, ids=[row[0] for row in ROWS])
def test_each_corpus_file_reads_and_decides_as_sources_says(name, kinds, verdict):
    found = p2p.read(text(name))
    assert sorted({item["kind"] for item in found}) == sorted(kinds)
    assert p2p.detect(text(name)) == [kind for kind in p2p.KINDS if kind in kinds]
    result = p2p.decide(found)
    assert result["verdict"] == verdict, result
    assert result["rules"] and set(result["rules"]) <= p2p.RULE_IDS
    assert result["reason"].endswith(".")
    if verdict == p2p.VERDICT_UNKNOWN:
        assert result["missing"], "an unknown verdict names what would decide it"
    for item in found:
        assert p2p.describe(item)


# --- what each parser reads from the real files ---------------------------------------------------------------------


def test_topo_matrix_with_prompt_nics_and_legend():
    (item,) = p2p.parse_topo_matrix(text("stelline-esc8000a-topo-m-two-socket.txt"))
    links = {(p["a"], p["b"]): p["link"] for p in item["pairs"]}
    assert item["gpus"] == [0, 1, 2, 3]
    assert links == {(0, 1): "NODE", (0, 2): "SYS", (0, 3): "SYS", (1, 2): "SYS", (1, 3): "SYS", (2, 3): "NODE"}
    assert item["nics"] == {"NIC0": "mlx5_0", "NIC1": "mlx5_1", "NIC2": "mlx5_2", "NIC3": "mlx5_3"}
    assert item["affinity"]["2"] == {"cpu": "32-63", "numa": "1"}


def test_topo_matrix_with_tabs_and_no_legend():
    (item,) = p2p.parse_topo_matrix(text("nccl-667-topo-m-tabs-two-socket.txt"))
    assert [(p["a"], p["b"], p["link"]) for p in item["pairs"]] == [
        (0, 1, "PXB"), (0, 2, "SYS"), (0, 3, "SYS"), (1, 2, "SYS"), (1, 3, "SYS"), (2, 3, "PIX")]
    assert item["affinity"]["3"] == {"cpu": "28-55,84-111", "numa": "1"}


def test_topo_matrix_with_runs_of_spaces():
    (item,) = p2p.parse_topo_matrix(text("rtx6kpro-15-topo-m-phb.txt"))
    assert item["pairs"] == [{"a": 0, "b": 1, "link": "PHB"}]
    assert item["affinity"]["1"] == {"cpu": "0-13", "numa": "0"}


def test_topo_matrix_with_real_ansi_escapes_in_the_header():
    raw = text("nvidia-gpu-exporter-l40s-topo-m-ansi.txt")
    assert "\x1b[4mGPU0" in raw  # the capture keeps the terminal's bytes
    (item,) = p2p.parse_topo_matrix(raw)
    assert item["gpus"] == [0] and item["pairs"] == [] and item["affinity"]["0"]["cpu"] == "0-7"


@pytest.mark.parametrize("escape", ["\x1b[4m", "^[[4m", "\\x1b[4m", "\\033[4m", "[4m"],
                         ids=["ESC", "caret", "backslash-x1b", "backslash-033", "ESC-dropped"])
def test_topo_matrix_header_escapes_as_pastes_carry_them(escape):
    # The real multi-GPU matrix with its header underlined the way nvidia-smi does on a terminal, in each form a
    # paste keeps the escape in (built here from the real file).
    real = text("stelline-esc8000a-topo-m-two-socket.txt")
    reset = escape.replace("4m", "0m")
    pasted = real.replace("        GPU0    GPU1", f"\t{escape}GPU0    GPU1")
    pasted = pasted.replace("GPU NUMA ID", f"GPU NUMA ID{reset}")
    (item,) = p2p.parse_topo_matrix(pasted)
    assert item["gpus"] == [0, 1, 2, 3] and item["pairs"][1] == {"a": 0, "b": 2, "link": "SYS"}


def test_crlf_line_ends_read_like_lf():
    for name in ("stelline-esc8000a-topo-m-two-socket.txt", "club-3090-1124-topo-p2p-rw-gns.txt",
                 "lkml-20250701-lspci-root-ports-redirect.txt", "stelline-wrx90-p2pbandwidth-phb.txt",
                 "vllm-5458-nccl-p2p-cumem.txt", "gardenlinux-4556-cmdline-iommu-pt.txt"):
        assert p2p.read(text(name).replace("\n", "\r\n")) == p2p.read(text(name)), name


def test_topo_matrix_wrapped_rows_join():
    wrapped = p2p.parse_topo_matrix(text("synthetic-topo-m-wrapped-rows.txt"))[0]
    whole = p2p.parse_topo_matrix(text("stelline-esc8000a-topo-m-two-socket.txt"))[0]
    assert wrapped["pairs"] == whole["pairs"] and wrapped["affinity"] == whole["affinity"]
    assert set(wrapped["nics"]) == set(whole["nics"])


def test_topo_p2p_gns_and_its_meaning():
    (item,) = p2p.parse_topo_p2p(text("club-3090-1124-topo-p2p-rw-gns.txt"))
    assert item["gpus"] == [0, 1]
    assert {(p["a"], p["b"], p["status"], p["meaning"]) for p in item["not_ok"]} == {
        (0, 1, "GNS", "GPU not supported"), (1, 0, "GNS", "GPU not supported")}


def test_a_paste_of_two_outputs_with_prompts_an_error_line_and_a_cut_legend():
    found = p2p.read(text("aikitoria-13-topo-m-and-p2p-p-prompts.txt"))
    topo = next(item for item in found if item["kind"] == "topo_matrix")
    status = next(item for item in found if item["kind"] == "topo_p2p")
    assert topo["gpus"] == status["gpus"] == [0, 1, 2, 3, 4]
    assert {(p["a"], p["b"]): p["link"] for p in topo["pairs"]}[(3, 4)] == "PHB"
    assert status["capability"] == "p"  # from the prompt line above the matrix
    assert status["not_ok"] == []
    result = p2p.decide(found)
    assert result["verdict"] == "unknown" and "driver-ok-proves-nothing" in result["rules"]


def test_lspci_tree_places_gpus_under_their_root_ports():
    (item,) = p2p.parse_lspci(text("stelline-esc8000a-lspci-tv.txt"))
    gpus = {gpu["bdf"]: gpu["bridges_above"] for gpu in item["gpus"]}
    assert gpus == {"0000:01:00.0": ["0000:00:01.1"], "0000:41:00.0": ["0000:40:01.1"]}
    bridges = {b["bdf"]: (b["secondary"], b["subordinate"]) for b in item["bridges"]}
    assert bridges["0000:40:01.1"] == (0x41, 0x41) and bridges["0000:20:03.1"] == (0x21, 0x21)
    # A nested switch (root port 01.1 -> switch 62 -> ...) is on another root here; the audio function is no GPU.
    assert all("Audio" not in gpu["name"] for gpu in item["gpus"])


def test_lspci_root_prompt_and_acs_redirect_on_named_bridges():
    (item,) = p2p.parse_lspci(text("lkml-20250701-lspci-root-ports-redirect.txt"))
    assert [(b["bdf"], b["redirect"]) for b in item["bridges"]] == [("0000:00:01.1", True), ("0000:00:01.2", True)]
    assert item["bridges"][0]["acs_ctl"]["SrcValid"] is True and item["bridges"][0]["acs_ctl"]["TransBlk"] is False


def test_lspci_mail_wrapped_block_joins_its_lines():
    (item,) = p2p.parse_lspci(text("amd-gfx-20211022-lspci-mail-wrapped.txt"))
    (bridge,) = item["bridges"]
    assert bridge["bdf"] == "0000:00:02.1" and bridge["name"].endswith("GPP Bridge (prog-if 00 [Normal decode])")
    assert (bridge["secondary"], bridge["subordinate"]) == (1, 1)
    # ACSCtl's last two flags were on the next line: still read.
    assert bridge["acs_ctl"] == {"SrcValid": True, "TransBlk": False, "ReqRedir": True, "CmpltRedir": True,
                                 "UpstreamFwd": True, "EgressCtrl": False, "DirectTrans": False}
    assert item["iommu_groups_seen"] is True


def test_lspci_grep_lines_srcvalid_only_and_redirect():
    (only_sv,) = p2p.parse_lspci(text("nccl-606-acsctl-srcvalid-only.txt"))
    assert len(only_sv["loose_acs"]) == 9 and not any(a["redirect"] for a in only_sv["loose_acs"])
    assert sum(a["acs_ctl"]["SrcValid"] for a in only_sv["loose_acs"]) == 4
    (redirect,) = p2p.parse_lspci(text("nccl-629-acsctl-redirect-tabs.txt"))
    assert sum(bool(a["redirect"]) for a in redirect["loose_acs"]) == 4 and len(redirect["loose_acs"]) == 15


def test_lspci_gpu_bar1_through_prompt_sudo_and_step_lines():
    (rtx6000,) = p2p.parse_lspci(text("stelline-wrx90-lspci-gpu-sudo.txt"))
    (gpu,) = rtx6000["gpus"]
    assert (gpu["bdf"], gpu["bar1_bytes"], gpu["bar1_region"]) == ("0000:c1:00.0", 64 << 30, 1)
    assert rtx6000["notes"] == []
    (rtx5090,) = p2p.parse_lspci(text("aikitoria-15-lspci-5090-bar1-256m.txt"))
    (gpu,) = rtx5090["gpus"]
    assert gpu["bar1_bytes"] == 256 << 20
    assert any("256 MiB BAR1" in note and "Resizable BAR" in note for note in rtx5090["notes"])


def test_iommu_from_the_command_line():
    (pt,) = p2p.parse_iommu(text("gardenlinux-4556-cmdline-iommu-pt.txt"))
    assert (pt["mode"], pt["translating"], pt["params"]["iommu"]) == ("passthrough", False, "pt")
    (grub,) = p2p.parse_iommu(text("stelline-esc8000a-grub-cmdline.txt"))
    assert grub["mode"] == "off" and grub["params"]["amd_iommu"] == "off"
    assert grub["cmdline"].startswith("GRUB_CMDLINE_LINUX_DEFAULT=")
    assert any("GRUB configuration" in note for note in grub["notes"])


def test_iommu_translated_line_alone_is_no_evidence():
    (item,) = p2p.parse_iommu(text("fwupd-5304-default-domain-translated.txt"))
    assert item["mode"] is None and item["translating"] is None
    assert any("prints it with the IOMMU off" in note for note in item["notes"])
    # With the IOMMU's own lines it is: the same line on a host whose AMD-Vi is up translates.
    (host,) = p2p.parse_iommu(text("synthetic-dmesg-amd-vi-translated.txt"))
    assert (host["mode"], host["hardware"], host["translating"]) == ("translated", "amd", True)
    # And the command line wins over it: intel_iommu=off with the same line is off.
    (off,) = p2p.parse_iommu("BOOT_IMAGE=/vmlinuz-6.8.0-60-generic root=/dev/sda1 ro intel_iommu=off\n"
                             + text("fwupd-5304-default-domain-translated.txt"))
    assert off["mode"] == "off"


def test_iommu_on_with_mode_not_shown():
    (intel,) = p2p.parse_iommu(text("intel-dp-1836-dmesg-dmar-enabled.txt"))
    assert (intel["mode"], intel["hardware"], intel["translating"]) == ("on", "intel", None)
    (amd,) = p2p.parse_iommu(text("amdsev-62-dmesg-amd-vi-groups.txt"))
    assert (amd["mode"], amd["hardware"]) == ("on", "amd")


def test_iommu_page_faults_from_nvidia():
    (item,) = p2p.parse_iommu(text("cuda-samples-48-syslog-io-page-fault.txt"))
    assert item["mode"] == "translated" and len(item["nvidia_faults"]) == 9
    assert item["nvidia_faults"][0]["device"] == "0000:07:00.0"


def test_nccl_transports_and_results():
    (cumem,) = p2p.parse_nccl(text("vllm-5458-nccl-p2p-cumem.txt"))
    assert cumem["transports"] == {"P2P/CUMEM": 5} and cumem["p2p_used"] and cumem["data_check_ok"] is None
    (shm,) = p2p.parse_nccl(text("vllm-9920-nccl-shm.txt"))
    assert shm["families"] == ["SHM"] and shm["init_complete"] and not shm["p2p_used"]
    (ok,) = p2p.parse_nccl(text("synthetic-nccl-tests-p2p-data-check-ok.txt"))
    assert (ok["version"], ok["results"]["rows"], ok["data_check_ok"]) == ("2.27.7", 3, True)
    assert ok["results"]["avg_busbw_gbps"] == pytest.approx(23.0812)
    (bad,) = p2p.parse_nccl(text("synthetic-nccl-tests-p2p-data-check-failed.txt"))
    assert bad["results"]["wrong_rows"] == 2 and bad["results"]["out_of_bounds"] == {"count": 52, "ok": False}
    assert bad["data_check_ok"] is False


def test_p2p_bandwidth_pairs():
    (broken,) = p2p.parse_p2p_bandwidth(text("aikitoria-9-p2pbandwidth-rebar-off.txt"))
    assert {(p["a"], p["b"], p["enabled"], p["disabled"]) for p in broken["broken"]} == {
        (0, 1, 12.19, 42.47), (1, 0, 2.01, 42.54)}
    (sys_pairs,) = p2p.parse_p2p_bandwidth(text("stelline-esc8000a-p2pbandwidth-sys-pairs.txt"))
    assert sys_pairs["devices"]["3"] == "NVIDIA RTX 6000 Ada Generation"
    assert {p["state"] for p in sys_pairs["pairs"]} == {"ok"} and len(sys_pairs["pairs"]) == 12
    (pair,) = p2p.parse_p2p_bandwidth(text("tinygrad-44-p2pbandwidth-4090-pair-prompt.txt"))
    assert pair["pairs"][0]["enabled"] == 6.60 and pair["pairs"][0]["disabled"] == 6.34


def test_can_access_lines_alone_prove_nothing():
    lines = "\n".join(line for line in text("stelline-esc8000a-p2pbandwidth-sys-pairs.txt").splitlines()
                      if line.startswith(("[P2P", "Device")))
    result = p2p.decide(p2p.read(lines))
    assert result["verdict"] == "unknown" and "driver-ok-proves-nothing" in result["rules"]


# --- refusals -------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("pasted", "words"), [
    ("", "empty"),
    ("\x00\x01binary", "NUL bytes"),
    ("Hello, this is a question about my GPUs.\n", "see docs/p2p.md for what to paste"),
])
def test_read_refuses_with_a_sentence(pasted, words):
    with pytest.raises(p2p.Unreadable, match=re.escape(words)):
        p2p.read(pasted)


def test_a_cut_topo_matrix_is_refused():
    cut = "\n".join(text("stelline-esc8000a-topo-m-two-socket.txt").splitlines()[:4])  # prompt, header, 2 rows
    with pytest.raises(p2p.Unreadable, match=r"no row for GPU2, GPU3, NIC0, NIC1, NIC2, NIC3: the paste is cut"):
        p2p.read(cut)


def test_a_cell_that_is_no_link_type_is_refused():
    bad = text("rtx6kpro-15-topo-m-phb.txt").replace("PHB      X", "QPI      X")
    with pytest.raises(p2p.Unreadable, match=r"row GPU1, column GPU0 .* reads 'QPI', which is no topo -m link type"):
        p2p.parse_topo_matrix(bad)


@pytest.mark.parametrize(("parser", "words"), [
    (p2p.parse_topo_matrix, "paste the whole output of nvidia-smi topo -m"),
    (p2p.parse_topo_p2p, "nvidia-smi topo -p2p rw"),
    (p2p.parse_lspci, "paste sudo lspci -vvv"),
    (p2p.parse_iommu, "cat /proc/cmdline"),
    (p2p.parse_nccl, "NCCL_DEBUG=INFO"),
    (p2p.parse_p2p_bandwidth, "./p2pBandwidthLatencyTest"),
])
def test_each_parser_refuses_other_text_naming_what_to_paste(parser, words):
    with pytest.raises(p2p.Unreadable, match=re.escape(words)):
        parser("nothing to see here\n")


# --- the decision table, both ways --------------------------------------------------------------------------------

REDIRECT = "lkml-20250701-lspci-root-ports-redirect.txt"
TRANSLATED = "synthetic-dmesg-amd-vi-translated.txt"


def test_the_hang_state_gets_shm_with_the_bridges_fix():
    result = decide(REDIRECT, TRANSLATED)
    assert result["verdict"] == "pcie_shm" and result["rules"][0] == "acs-redirect-iommu-translating"
    assert "0000:00:01.1, 0000:00:01.2" in result["reason"]
    assert "setpci -s 0000:00:01.1 ECAP_ACS+0x6.w=0000:000c; setpci -s 0000:00:01.2 ECAP_ACS+0x6.w=0000:000c" \
        in result["fix"]
    assert "pci=disable_acs_redir=0000:00:01.1;0000:00:01.2" in result["fix"]
    assert "iommu=pt" in result["fix"] and "BIOS" in result["fix"]


@pytest.mark.parametrize(("names", "rule"), [
    ((REDIRECT, "gardenlinux-4556-cmdline-iommu-pt.txt"), "acs-redirect-iommu-not-translating"),
    (("nccl-629-acsctl-redirect-tabs.txt", "stelline-esc8000a-grub-cmdline.txt"), "acs-redirect-iommu-not-translating"),
    (("nccl-606-acsctl-srcvalid-only.txt", TRANSLATED), "no-acs-redirect"),
], ids=["redirect-passthrough", "redirect-iommu-off", "srcvalid-only-translated"])
def test_the_healthy_states_that_look_most_like_it_keep_p2p(names, rule):
    result = decide(*names)
    assert result["verdict"] == "pcie_p2p" and result["rules"][0] == rule
    assert "Not proven by a functional test" in result["reason"]


def test_translated_line_without_the_iommu_lines_does_not_make_the_hang_state():
    result = decide(REDIRECT, "fwupd-5304-default-domain-translated.txt")
    assert result["verdict"] == "unknown"
    assert any("IOMMU mode" in item for item in result["missing"])


def test_a_data_checked_all_reduce_outranks_the_static_state():
    result = decide(REDIRECT, TRANSLATED, "synthetic-nccl-tests-p2p-data-check-ok.txt")
    assert result["verdict"] == "pcie_p2p" and result["rules"][0] == "nccl-data-check-ok"
    assert "acs-redirect-iommu-translating" in result["rules"] and result["contradictions"]
    failed = decide("stelline-wrx90-acsctl-all-clear.txt", "gardenlinux-4556-cmdline-iommu-pt.txt",
                    "synthetic-nccl-tests-p2p-data-check-failed.txt")
    assert failed["verdict"] == "pcie_shm" and failed["rules"][0] == "nccl-data-check-failed"


def test_the_bandwidth_test_cannot_clear_the_hang_state_without_a_data_check():
    result = decide(REDIRECT, TRANSLATED, "stelline-wrx90-p2pbandwidth-phb.txt")
    assert result["verdict"] == "unknown" and result["contradictions"]
    assert any("data-checked all-reduce" in item for item in result["missing"])


def test_broken_bandwidth_outranks_a_clean_static_state():
    result = decide("stelline-wrx90-acsctl-all-clear.txt", "gardenlinux-4556-cmdline-iommu-pt.txt",
                    "aikitoria-9-p2pbandwidth-rebar-off.txt")
    assert result["verdict"] == "pcie_shm" and result["rules"][0] == "bandwidth-broken"
    assert "GPU1->GPU0 moves 2.01 GB/s" in result["reason"]


def test_a_grep_of_acsctl_counts_wherever_the_gpus_are():
    result = decide("stelline-esc8000a-lspci-tv.txt", "nccl-629-acsctl-redirect-tabs.txt", TRANSLATED)
    assert result["verdict"] == "pcie_shm" and result["acs"]["redirect_bridges"] == []


def test_redirect_off_the_gpus_path_does_not_count():
    # A tree and -vvv blocks of the same (made-up) host: the redirecting port 40:03.1 is not above either GPU.
    host = text("stelline-esc8000a-lspci-tv.txt") + (
        "\n40:03.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Device 149f\n"
        "\tBus: primary=40, secondary=43, subordinate=43, sec-latency=0\n"
        "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir+ CmpltRedir+ UpstreamFwd+ EgressCtrl- DirectTrans-\n"
        "40:01.1 PCI bridge: Advanced Micro Devices, Inc. [AMD] Device 149f\n"
        "\tBus: primary=40, secondary=41, subordinate=41, sec-latency=0\n"
        "\t\tACSCtl:\tSrcValid+ TransBlk- ReqRedir- CmpltRedir- UpstreamFwd- EgressCtrl- DirectTrans-\n")
    result = p2p.decide(p2p.read(host) + p2p.read(text(TRANSLATED)))
    assert result["verdict"] == "pcie_p2p" and result["acs"]["path_known"] is True


def test_gpus_limit_the_pairs_judged():
    gns = p2p.read(text("club-3090-1124-topo-p2p-rw-gns.txt"))
    assert p2p.decide(gns, gpus=[0, 1])["verdict"] == "pcie_shm"
    assert p2p.decide(gns, gpus=[2, 3])["verdict"] == "unknown"


def test_every_rule_has_state_verdict_and_source():
    ids = [rule["id"] for rule in p2p.RULES]
    assert len(ids) == len(set(ids))
    for rule in p2p.RULES:
        assert rule["state"] and rule["source"] and rule["verdict"] in ("pcie_p2p", "pcie_shm", "unknown", "stuck")
        if rule["verdict"] in ("pcie_shm", "stuck"):
            assert rule["fix"], rule["id"]


def test_the_setpci_idiom_clears_only_the_redirect_bits():
    # ReqRedir is bit 2 (0x4) and CmpltRedir bit 3 (0x8) of the ACS control register at ECAP_ACS+0x6; the mask
    # 000c leaves SrcValid, TransBlk, UpstreamFwd, EgressCtrl and DirectTrans as they are.
    assert p2p.setpci_fix(["0000:40:01.1"]) == "setpci -s 0000:40:01.1 ECAP_ACS+0x6.w=0000:000c"
    assert int("000c", 16) == (1 << 2) | (1 << 3)


def test_docs_table_lists_every_rule_in_the_order_they_decide():
    docs = (Path(__file__).resolve().parents[2] / "docs" / "p2p.md").read_text(encoding="utf-8")
    table = docs.split("\n## The evidence table", 1)[1].split("\n## ", 1)[0]  # other tables name verdicts alike
    listed = re.findall(r"^\| `([a-z0-9-]+)` \|", table, re.M)
    assert listed == [rule["id"] for rule in p2p.RULES]
