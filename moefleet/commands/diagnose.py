"""moefleet diagnose: why did this SGLang start fail, and what to change.

The classifier is the one the readiness module uses (plugins/module_utils/sglang_log.py). Exit codes:
0 the log shows a ready server; 1 it shows a failure (oom, crashed, hung) or ends while the server was
still starting (incomplete); 2 the input cannot be read as a log (no SGLang, journal or traceback line).

A log of several starts (a whole unit's journal) is judged by its last start, from its last server_args= line.
It reads SGLang's own output and journal exports: journalctl's short, short-precise, short-iso and
short-full formats, `-o json` (one object per line) and `-o export` (fields as NAME=value, entries
separated by a blank line; a field holding control characters or newlines, such as a MESSAGE with colour
codes, in the format's binary-safe form: its name, a 64-bit little-endian length, the bytes); lines as
container and cloud loggers print them (docker compose `svc-1  | `, docker/kubectl timestamps, kubectl
--prefix `[pod/name/container]`, CloudWatch and GCP time stamps, docker's json-file lines), colour codes
(ESC or pasted as `\\x1b[..m` / `^[[..m`), and logs exported newest first. On a host:
`journalctl -u sglang.service -o short-precise --since -1h > sglang.log` (or `-o json`, `-o export`).

It reads the kernel's side too: lines of `journalctl -k` (or dmesg) with NVIDIA Xids, a GPU fallen off the bus,
fatal PCIe errors or a link down, and NCCL watchdog timeouts, each with its meaning and what to do (the fault
watcher's event table, plugins/module_utils/host_faults.py; `journalctl -k -b -o short-precise > kernel.log`, or
both journals at once: `journalctl -k -u sglang.service -b`). A kernel excerpt without any SGLang line exits 1 when an
event makes the host unfit to serve, 0 otherwise.

A saved log that ends while starting is ``starting`` and exits 1 as incomplete. With ``--hang-seconds N``
it is ``hung`` instead once its last line is at least N seconds old: for a file, by its modification
time (so a log still being written is not called hung); for stdin, which has no age, the log is taken
as finished.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from ansible_collections.moefleet.serving.plugins.module_utils.host_faults import is_kernel_log
from ansible_collections.moefleet.serving.plugins.module_utils.host_faults import reason as fault_reason
from ansible_collections.moefleet.serving.plugins.module_utils.host_faults import scan as scan_faults
from ansible_collections.moefleet.serving.plugins.module_utils.sglang_log import classify, is_log

from moefleet.commands import number_problem
from moefleet.commands._common import read_pasted_bytes

EXIT_READY, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2


class BadInput(Exception):
    """The input is not a readable text log; the message is one sentence for the operator."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "diagnose",
        help="classify a saved SGLang log or journal export: ready, oom, crashed or hung, and what to change",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("file", metavar="FILE", help="the log file or journalctl export; '-' reads stdin")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument(
        "--hang-seconds",
        type=float,
        metavar="N",
        help="call a log that ends while starting 'hung' once it has been silent this long",
    )
    parser.set_defaults(func=run)


def _read(path: str) -> tuple[str, float | None]:
    """The log's text and its age in seconds (None for stdin)."""
    try:
        data = read_pasted_bytes(path, "a log")
        age = None if path == "-" else max(0.0, time.time() - os.stat(path).st_mtime)
    except ValueError as err:
        raise BadInput(str(err)) from None
    except OSError as err:
        raise BadInput(f"{path}: cannot be read ({err.strerror or err}).") from None
    name = "stdin" if path == "-" else path
    exported = _export_as_text(data)
    if exported is not None:
        data = exported
    if b"\x00" in data:
        raise BadInput(f"{name}: looks binary (it has NUL bytes), not a text log; pass the log or a journal export.")
    if not data.strip():
        raise BadInput(f"{name}: is empty; there is nothing to diagnose.")
    return data.decode("utf-8", errors="replace"), age


_FIELD_NAME = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")


def _export_as_text(data: bytes) -> bytes | None:
    """A `journalctl -o export` stream with binary-safe fields (systemd's Journal Export Format: a field
    holding control characters or newlines is its name, a newline, a 64-bit little-endian length, the bytes
    and a newline) rewritten with every field as NAME=value, one entry per line of a multi-line MESSAGE;
    None when ``data`` is not such a stream (plain export streams are read as they are)."""
    if not (data.startswith(b"__CURSOR=") or b"\n__CURSOR=" in data[:4096]) or b"\x00" not in data:
        return None
    entries: list[list[tuple[bytes, bytes]]] = []
    fields: list[tuple[bytes, bytes]] = []
    pos = 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        line, pos = (data[pos:], len(data)) if end < 0 else (data[pos:end], end + 1)
        if not line:
            if fields:
                entries.append(fields)
            fields = []
        elif b"=" in line:
            name, _, value = line.partition(b"=")
            fields.append((name, value))
        elif _FIELD_NAME.fullmatch(line) and pos + 8 <= len(data):
            size = int.from_bytes(data[pos : pos + 8], "little")
            if pos + 8 + size > len(data):
                return None
            fields.append((line, data[pos + 8 : pos + 8 + size]))
            pos += 8 + size + (data[pos + 8 + size : pos + 9 + size] == b"\n")
        else:
            return None
    if fields:
        entries.append(fields)
    out = []
    for entry in entries:
        other = [(n, v) for n, v in entry if n != b"MESSAGE" and b"\n" not in v and b"\x00" not in v]
        for name, value in entry:
            if name != b"MESSAGE":
                continue
            for message in value.replace(b"\x00", b"").splitlines() or [b""]:
                out += [n + b"=" + v for n, v in other] + [b"MESSAGE=" + message, b""]
    return b"\n".join(out) + b"\n"


def _human(result: dict) -> str:
    state, oom = result["state"], result["oom"]
    head = state
    if state == "oom":
        head = f"oom in phase {oom['phase']}"
    elif state == "crashed":
        head = f"crashed, cause {result['cause']}" + (f" (phase {result['phase']})" if result["phase"] else "")
    elif state == "hung":
        head = f"hung in phase {result['phase']}"
    elif state == "starting":
        head = f"starting, incomplete: the log ends in phase {result['phase']}"
    rows = [("state", head)]
    if oom:
        gpu = "unknown" if oom["gpu"] is None else str(oom["gpu"])
        if oom["rank"]:
            gpu += f" (rank {oom['rank']})"
        rows.append(("gpu", gpu))
        sizes = []
        if oom["tried_to_allocate_mib"] is not None:
            sizes.append(f"tried to allocate {oom['tried_to_allocate_mib']:.2f} MiB")
        if oom["free_mib"] is not None:
            sizes.append(f"{oom['free_mib']:.2f} MiB free")
        if oom["capacity_gib"] is not None:
            sizes.append(f"of {oom['capacity_gib']:.2f} GiB total")
        rows.append(("sizes", ", ".join(sizes) if sizes else "not in the log"))
    elif result["rank"]:
        rows.append(("rank", result["rank"]))
    if result["line"]:
        label = "line" if result["line_number"] is None else f"line {result['line_number']}"
        if state == "hung":
            label = "last line"
        rows.append((label, result["line"]))
    rows.append(("advice", result["advice"]))
    width = max(len(label) for label, _ in rows) + 1
    return "\n".join(f"{(label + ':').ljust(width)} {value}" for label, value in rows)


def run(args: argparse.Namespace) -> int:
    problem = number_problem("--hang-seconds", args.hang_seconds, 7 * 86400, "600")
    if problem:
        print(f"moefleet diagnose: {problem}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        text, age = _read(args.file)
    except BadInput as err:
        print(f"moefleet diagnose: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    faults = scan_faults(text)
    if (faults or is_kernel_log(text)) and not _has_server_lines(text):
        return _report_faults(args, faults)
    if not is_log(text):
        name = "stdin" if args.file == "-" else args.file
        print(
            f"moefleet diagnose: {name}: no SGLang, journal or traceback line in it; pass the server's log "
            "or a journal export (journalctl -u sglang.service -o short-precise).",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    idle = None
    if args.hang_seconds is not None:
        idle = float("inf") if age is None else age
    verdict = classify(text, idle_seconds=idle, hang_seconds=args.hang_seconds)
    result = verdict.to_dict()
    result["file"] = args.file
    result["incomplete"] = verdict.state == "starting"
    if result["incomplete"]:
        result["advice"] = (
            f"The log ends while the server was still starting (phase {verdict.phase}): collect the rest of "
            "the log, or pass --hang-seconds N to judge a log silent that long as hung."
        )
    result["host_faults"] = faults
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(_human(result) + ("\n" + _faults_text(faults) if faults else ""))
    return EXIT_READY if verdict.state == "ready" and not any(f["unfit"] for f in faults) else EXIT_FAILED


# What SGLang itself prints at any start (its server_args line, the progress lines, uvicorn): a log with none of them
# is a kernel excerpt.
_SERVER_LINE = re.compile(r"server_args=|Init torch distributed|Load weight|Scheduler hit an exception|Uvicorn running|"
                          r"fired up and ready|Traceback \(most recent call last\)")


def _has_server_lines(text: str) -> bool:
    return bool(_SERVER_LINE.search(text))


def _faults_text(faults: list[dict]) -> str:
    rows = []
    for fault in faults:
        rows.append(("fault", fault_reason(fault) + (" (the host is unfit to serve)" if fault["unfit"] else "")))
        rows.append(("line", fault["message"]))
        rows.append(("advice", fault["advice"]))
    width = max(len(label) for label, _ in rows) + 1
    return "\n".join(f"{(label + ':').ljust(width)} {value}" for label, value in rows)


def _report_faults(args: argparse.Namespace, faults: list[dict]) -> int:
    """A kernel excerpt (no SGLang line): its events, and 1 when one makes the host unfit; "no fault" (0) for a kernel
    log without one."""
    unfit = any(f["unfit"] for f in faults)
    state = "fault" if unfit else "recorded" if faults else "no fault"
    if args.json:
        print(json.dumps({"file": args.file, "state": state, "host_faults": faults}, indent=2))
    elif faults:
        print(_faults_text(faults))
    else:
        print("no fault: no Xid, fallen-off-the-bus, fatal PCIe or link-down line in this kernel log")
    return EXIT_FAILED if unfit else EXIT_READY
