"""moefleet diagnose: exit codes, JSON shape, sentences on bad input."""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from moefleet.cli import main

LOGS = Path(__file__).resolve().parents[1] / "data" / "sglang-logs"
OOM_LOG = LOGS / "14-oom_weight_load-gemma3-12b-4070tisuper-create-weights.log"
READY_LOG = LOGS / "18-ready-qwq32b-tp4-pcie-avail-mem-2.09.log"
HANG_LOG = LOGS / "22-hang-rtx6000ada-tp2-stuck-nccl-init.log"


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["diagnose", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def test_ready_log_exits_0(capsys):
    code, out, _ = _run(capsys, READY_LOG)
    assert code == 0
    assert out.startswith("state:") and "ready" in out


def test_oom_log_exits_1_and_says_phase_gpu_sizes_and_advice(capsys):
    code, out, _ = _run(capsys, OOM_LOG)
    assert code == 1
    assert "oom in phase weight_load" in out
    assert "gpu:" in out and "0 (rank TP0)" in out
    assert "tried to allocate 114.00 MiB, 54.38 MiB free, of 15.58 GiB total" in out
    assert "torch.OutOfMemoryError" in out
    assert "--mem-fraction-static will not help" in out


def test_json_shape(capsys):
    code, out, _ = _run(capsys, OOM_LOG, "--json")
    assert code == 1
    result = json.loads(out)
    assert {"state", "oom", "cause", "line", "advice"} <= set(result)
    assert result["state"] == "oom" and result["cause"] is None
    assert {"phase", "gpu", "tried_to_allocate_mib", "free_mib", "capacity_gib"} <= set(result["oom"])
    assert result["oom"]["phase"] == "weight_load"
    assert result["oom"]["tried_to_allocate_mib"] == 114.0


def test_json_for_a_crash_has_no_oom_and_a_cause(capsys):
    code, out, _ = _run(capsys, LOGS / "13-crash_other-r9700-qwen35-reap-keyerror-load-weights.log", "--json")
    result = json.loads(out)
    assert code == 1
    assert result["oom"] is None and result["state"] == "crashed" and result["cause"] == "bad_weights"
    assert result["line"].startswith("KeyError")


def test_stdin(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(OOM_LOG.read_bytes())))
    code, out, _ = _run(capsys, "-", "--json")
    assert code == 1 and json.loads(out)["state"] == "oom"


def test_a_log_that_ends_while_starting_is_incomplete(capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(HANG_LOG.read_bytes())
    code, out, _ = _run(capsys, log, "--json", "--hang-seconds", "600")
    result = json.loads(out)
    assert code == 1
    assert (result["state"], result["incomplete"]) == ("starting", True)  # freshly written: not hung yet
    assert "--hang-seconds" in result["advice"]


def test_an_old_log_that_ends_while_starting_is_hung_with_hang_seconds(capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(HANG_LOG.read_bytes())
    old = time.time() - 3600
    os.utime(log, (old, old))
    code, out, _ = _run(capsys, log, "--json", "--hang-seconds", "600")
    result = json.loads(out)
    assert code == 1
    assert (result["state"], result["phase"]) == ("hung", "nccl_init")


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda d: d / "missing.log", "no such file"),
        (lambda d: d, "is a directory"),
        (lambda d: (d / "core").write_bytes(b"\x7fELF\x00\x00\x01") and d / "core", "looks binary"),
        (lambda d: (d / "empty.log").write_text("") or d / "empty.log", "is empty"),
    ],
)
def test_bad_input_exits_2_with_one_sentence(capsys, tmp_path, make, words):
    path = make(tmp_path)
    code, out, err = _run(capsys, path)
    assert code == 2
    assert out == ""
    assert words in err
    assert err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_unreadable_file_exits_2(capsys, tmp_path):
    log = tmp_path / "server.log"
    log.write_text("x\n")
    log.chmod(0)
    code, _, err = _run(capsys, log)
    assert code == 2 and "permission denied" in err


@pytest.mark.parametrize("seconds", ["0", "-5", "nan", "inf"])
def test_bad_hang_seconds_exits_2(capsys, seconds):
    code, _, err = _run(capsys, READY_LOG, "--hang-seconds", seconds)
    assert code == 2 and err.startswith(f"moefleet diagnose: --hang-seconds {seconds} is not usable")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


# --- journal exports in the exact shapes journalctl prints (issue 15) ---------------------------------------
# One OOM start, as SGLang's unit writes it to the journal; each format below is what
# `journalctl -u sglang.service -o FORMAT` prints for those entries (systemd's Journal Export Formats and
# journalctl(1): short-precise is "Mon DD HH:MM:SS.ffffff HOST IDENT[PID]: MESSAGE"; json one object per entry
# and line, every value a string; export NAME=value fields, a blank line between entries, and a field that
# holds control characters (the colour codes of SGLang's tqdm bars and loggers) or newlines in the binary-safe
# form NAME, newline, 64-bit little-endian length, the bytes, newline).

JOURNAL_MESSAGES = [
    "[2026-12-01 03:12:40] server_args=ServerArgs(model_path='/srv/models/Kimi-K2.6', tp_size=8, ep_size=4)",
    "[2026-12-01 03:12:44 TP2] Load weight begin. avail mem=93.97 GB",
    "[2026-12-01 03:12:59 TP2] Scheduler hit an exception: Traceback (most recent call last):",
    '  File "/opt/sglang/venv/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 2310, in run',
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB. GPU 2 has a total capacity of "
    "94.97 GiB of which 136.94 MiB is free. Including non-PyTorch memory, this process has 94.83 GiB memory in use.",
    "[2026-12-01 03:12:59] Received sigquit from a child process. It usually means the child failed.",
]
T0 = 1764558760_000000  # 2026-12-01 03:12:40 UTC, in microseconds
BOOT, MACHINE = "6d2a0e5c3b9a4f1e8c7d6b5a49382716", "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
INVOCATION = "a1b2c3d4e5f60718293a4b5c6d7e8f90"


def _entry(i: int, message: str) -> dict[str, str]:
    return {
        "__CURSOR": f"s=3c1f0b7a9e2d4c5b8a6f7e1d2c3b4a59;i={0x1a2b + i:x};b={BOOT};m={0x4c4b40 + i:x};"
        f"t={T0 + i * 1000:x};x=9f8e7d6c5b4a3921",
        "__REALTIME_TIMESTAMP": str(T0 + i * 1000),
        "__MONOTONIC_TIMESTAMP": str(5000000 + i * 1000),
        "_BOOT_ID": BOOT,
        "_MACHINE_ID": MACHINE,
        "_HOSTNAME": "gpu-7",
        "PRIORITY": "6",
        "SYSLOG_FACILITY": "3",
        "_UID": "998",
        "_GID": "998",
        "_TRANSPORT": "stdout",
        "_STREAM_ID": "5c0d7e9a1b2c4d3e8f7a6b5c4d3e2f1a",
        "SYSLOG_IDENTIFIER": "python3",
        "_PID": "4242",
        "_COMM": "python3",
        "_EXE": "/usr/bin/python3.11",
        "_CMDLINE": "/opt/sglang/venv/bin/python3 -m sglang.launch_server --config /run/credentials/sglang.service/...",
        "_SYSTEMD_CGROUP": "/system.slice/sglang.service",
        "_SYSTEMD_UNIT": "sglang.service",
        "_SYSTEMD_SLICE": "system.slice",
        "_SYSTEMD_INVOCATION_ID": INVOCATION,
        "MESSAGE": message,
    }


def _short_precise() -> str:
    return "".join(
        f"Dec 01 03:12:{40 + i // 1000:02d}.{i * 1000 % 1000000:06d} gpu-7 python3[4242]: {m}\n"
        for i, m in enumerate(JOURNAL_MESSAGES)
    )


def _json() -> str:
    return "".join(json.dumps(_entry(i, m), separators=(",", ":")) + "\n" for i, m in enumerate(JOURNAL_MESSAGES))


def _export(colour: bool = False) -> bytes:
    out = b""
    for i, m in enumerate(JOURNAL_MESSAGES):
        for name, value in _entry(i, m).items():
            data = value.encode()
            if name == "MESSAGE" and colour and "OutOfMemoryError" in value:
                data = b"\x1b[31m" + data + b"\x1b[0m"
            if any(c < 32 and c != 9 for c in data):
                out += name.encode() + b"\n" + len(data).to_bytes(8, "little") + data + b"\n"
            else:
                out += name.encode() + b"=" + data + b"\n"
        out += b"\n"
    return out


@pytest.mark.parametrize(
    ("form", "content"),
    [
        ("plain", "\n".join(JOURNAL_MESSAGES) + "\n"),
        ("short-precise", _short_precise()),
        ("json", _json()),
        ("export", _export()),
        ("export with a binary-safe MESSAGE", _export(colour=True)),
    ],
)
def test_each_journal_format_reads_as_the_same_oom(capsys, tmp_path, form, content):
    log = tmp_path / "sglang.log"
    if isinstance(content, bytes):
        log.write_bytes(content)
    else:
        log.write_text(content, encoding="utf-8")
    code, out, err = _run(capsys, log, "--json")
    assert code == 1, err
    result = json.loads(out)
    assert (result["state"], result["oom"]["phase"], result["oom"]["gpu"]) == ("oom", "weight_load", 2), form
    assert result["oom"]["tried_to_allocate_mib"] == 672.0 and result["oom"]["capacity_gib"] == 94.97
    assert "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 672.00 MiB" in result["line"]


def test_the_binary_safe_export_field_is_the_one_the_format_defines():
    raw = _export(colour=True)
    at = raw.index(b"\nMESSAGE\n") + len(b"\nMESSAGE\n")
    size = int.from_bytes(raw[at : at + 8], "little")
    assert raw[at + 8 : at + 8 + size].startswith(b"\x1b[31mtorch.OutOfMemoryError")
    assert raw[at + 8 + size : at + 9 + size] == b"\n"


@pytest.mark.parametrize("name", ["docs/architecture.md", "pyproject.toml", "docs/facts.md"])
def test_a_file_that_is_not_a_log_exits_2_with_a_sentence(capsys, name):
    code, out, err = _run(capsys, Path(__file__).resolve().parents[2] / name)
    assert code == 2 and out == ""
    assert "no SGLang, journal or traceback line in it; pass the server's log or a journal export" in err
    assert len(err.strip().splitlines()) == 1


def test_help_says_how_to_export_the_journal(capsys):
    with pytest.raises(SystemExit):
        main(["diagnose", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "journalctl -u sglang.service -o short-precise" in text
    assert "64-bit little-endian length" in text


LAUNCH_LINES = {
    # SGLang's launch line, logged once per start before any rank runs: 0.5.10's dataclass repr (as in
    # 11-ready-rtx3090-...log), 0.5.23's resolved record as a dict (entrypoints/engine.py:
    # logger.info(f"server_args={_server_args_for_logging(server_args)}"))
    "0.5.10": "server_args=ServerArgs(model_path='/models/k', tp_size=4, mem_fraction_static=0.8)",
    "0.5.23": "server_args={'model_path': '/models/k', 'tp_size': 4, 'mem_fraction_static': 0.8}",
}


@pytest.mark.parametrize("release", sorted(LAUNCH_LINES))
def test_a_log_of_several_starts_is_judged_by_its_last_start(capsys, tmp_path, release):
    def _launch(when: str) -> str:
        return f"[{when}] {LAUNCH_LINES[release]}\n"

    # A whole unit's journal: an OOM start, then a start that served. The OOM is history, not the verdict.
    oom_then_ready = tmp_path / "two-starts.log"
    oom_then_ready.write_text(_launch("2025-03-01 10:00:00") + OOM_LOG.read_text()
                              + _launch("2025-03-01 10:05:00") + READY_LOG.read_text())
    code, out, _ = _run(capsys, oom_then_ready)
    assert code == 0 and out.startswith("state:") and "ready" in out.splitlines()[0]
    ready_then_oom = tmp_path / "two-starts-again.log"
    text = _launch("2025-03-01 10:00:00") + READY_LOG.read_text() + _launch("2025-03-01 10:05:00") + OOM_LOG.read_text()
    ready_then_oom.write_text(text)
    code, out, _ = _run(capsys, ready_then_oom, "--json")
    result = json.loads(out)
    assert code == 1 and result["state"] == "oom" and result["phase"] == "weight_load"
    # the line number counts from the top of the file, across both starts
    assert text.splitlines()[result["line_number"] - 1].endswith(result["line"])


KERNEL = ("Dec 02 10:00:01 gpu-7 kernel: NVRM: GPU at PCI:0000:61:00: GPU-5a3e2c1b-0d4f-4a1e-9c2b-7e6f5d4c3b2a\n"
          "Dec 02 10:00:01 gpu-7 kernel: NVRM: Xid (PCI:0000:61:00): 79, pid='<unknown>', name=<unknown>, GPU has "
          "fallen off the bus.\n"
          "Dec 02 10:00:01 gpu-7 kernel: NVRM: GPU 0000:61:00.0: GPU has fallen off the bus.\n")


def test_a_kernel_excerpt_names_the_fault_and_what_to_do(capsys, tmp_path):
    path = tmp_path / "kernel.log"
    path.write_text(KERNEL)
    code, out, _ = _run(capsys, path)
    assert code == 1
    assert out.splitlines()[0] == ("fault:  PCI 0000:61:00: Xid 79 GPU has fallen off the bus (the host is unfit to "
                                   "serve)")
    assert "moefleet remediate" in out and out.count("fault:") == 1  # the driver's second line is the same fault
    path.write_text("[ 812.301] NVRM: Xid (PCI:0000:01:00): 13, pid=7, name=python3, Graphics SM Warp Exception\n")
    code, out, _ = _run(capsys, path, "--json")
    assert code == 0 and json.loads(out)["host_faults"][0]["code"] == 13  # an application error: recorded


def test_a_server_log_with_the_kernel_lines_has_both(capsys, tmp_path):
    path = tmp_path / "both.log"
    path.write_text(READY_LOG.read_text() + KERNEL)
    code, out, _ = _run(capsys, path, "--json")
    result = json.loads(out)
    assert code == 1 and result["state"] == "ready" and [f["code"] for f in result["host_faults"]] == [79]


def test_a_healthy_kernel_log_is_no_fault_not_a_bad_input(capsys, tmp_path):
    path = tmp_path / "dmesg.txt"
    path.write_text("[    4.301245] NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release "
                    "Build\n"
                    "[   61.772010] NVRM: gpuClearFbhubPoisonIntrForBug2924523_GA100: FBHUB Interrupt detected. "
                    "Clearing it.\n"
                    "[   62.000101] nvme nvme0: 16/0/0 default/read/poll queues\n")
    code, out, err = _run(capsys, path)
    assert (code, err) == (0, "") and out.startswith("no fault:")
    code, out, _ = _run(capsys, path, "--json")
    assert code == 0 and json.loads(out)["state"] == "no fault" and json.loads(out)["host_faults"] == []


def test_a_syslog_excerpt_without_hostnames_with_the_three_line_record(capsys, tmp_path):
    path = tmp_path / "kern.log"
    path.write_text("Mar 29 15:38:59 kernel: NVRM: The NVIDIA GPU 0000:b3:00.0\n"
                    "Mar 29 15:38:59 kernel: NVRM: (PCI ID: 10de:2bb5) installed in this system has\n"
                    "Mar 29 15:38:59 kernel: NVRM: fallen off the bus and is not responding to commands.\n")
    code, out, _ = _run(capsys, path)
    assert code == 1 and out.splitlines()[0].startswith("fault:  PCI 0000:b3:00.0: GPU has fallen off the bus")
