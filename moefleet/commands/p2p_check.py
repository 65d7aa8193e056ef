"""moefleet p2p-check: judge pasted outputs offline: can these GPUs use PCIe peer-to-peer (NCCL set pcie_p2p), or
should they go through shared memory (pcie_shm), and what to fix.

Pass one or more files ('-' reads stdin), each holding any of: nvidia-smi topo -m, nvidia-smi topo -p2p rw,
sudo lspci -vvv (or lspci -tv, or lspci -vvv | grep ACSCtl), cat /proc/cmdline, the kernel's IOMMU lines
(journalctl -k -b | grep -i -e iommu -e dmar -e amd-vi), NCCL_DEBUG=INFO output or an nccl-tests run, and CUDA
samples' p2pBandwidthLatencyTest. Pastes may carry shell prompts, sudo lines, colour codes, CRLF, tabs or wrapped
rows. It prints what it read from each file, then one verdict for all of them together, its reason, the fix and,
for an unknown verdict, what would decide it (docs/p2p.md has the rules and their sources).

The hangs in public reports came from ACS request/completion redirect on a bridge between the GPUs while the IOMMU
translated; a functional result (a data-checked nccl-tests all-reduce, or p2pBandwidthLatencyTest) outranks the
static state, and the driver's own "P2P OK" proves nothing.

Exit codes: 0 P2P is fine (pcie_p2p); 1 shared memory is advised (pcie_shm); 2 an input cannot be read (a
sentence on stderr names it; the verdict of the files read is still printed); 3 the evidence decides nothing
(unknown: what is missing is named).
"""

from __future__ import annotations

import argparse
import json
import sys

from ansible_collections.moefleet.serving.plugins.module_utils.p2p_evidence import (
    RULES,
    VERDICT_P2P,
    VERDICT_SHM,
    Unreadable,
    decide,
    describe,
    read,
)

from moefleet.commands._common import read_pasted

EXIT_P2P, EXIT_SHM, EXIT_BAD_INPUT, EXIT_UNKNOWN = 0, 1, 2, 3


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "p2p-check",
        help="judge pasted topo/lspci/IOMMU/NCCL/p2pBandwidthLatencyTest outputs: pcie_p2p or pcie_shm, and the fix",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("files", metavar="FILE", nargs="+", help="a saved or pasted output; '-' reads stdin")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    parser.add_argument("--gpus", metavar="LIST",
                        help="judge only these GPUs' pairs (indices as nvidia-smi numbers them, e.g. 0,1)")
    parser.set_defaults(func=run)


def _gpus(value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        gpus = sorted({int(part) for part in value.split(",") if part.strip()})
    except ValueError:
        gpus = []
    if len(gpus) < 2 or any(gpu < 0 for gpu in gpus):
        raise Unreadable(f"--gpus {value!r} is not a list of at least two GPU indices; give e.g. --gpus 0,1.")
    return gpus


def _text(files: list[dict], verdict: dict | None) -> str:
    out = []
    for entry in files:
        out.append(f"{entry['file']}:")
        if "error" in entry:
            out.append(f"  unreadable: {entry['error']}")
            continue
        out += [f"  {line}" for line in entry["read"]]
    if verdict is None:
        return "\n".join(out)
    rows = [("verdict", verdict["verdict"]), ("reason", verdict["reason"])]
    if verdict["fix"]:
        rows.append(("fix", verdict["fix"]))
    rows += [("missing", item) for item in verdict["missing"]]
    rows += [("contradiction", item) for item in verdict["contradictions"]]
    rows += [("note", item) for item in verdict["notes"]]
    rows.append(("rules", ", ".join(verdict["rules"]) + " (docs/p2p.md)"))
    width = max(len(label) for label, _ in rows) + 1
    out.append("")
    out += [f"{(label + ':').ljust(width)} {value}" for label, value in rows]
    return "\n".join(out)


def run(args: argparse.Namespace) -> int:
    try:
        gpus = _gpus(args.gpus)
    except Unreadable as err:
        print(f"moefleet p2p-check: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    files: list[dict] = []
    evidence: list[dict] = []
    unreadable = False
    for path in args.files:
        name = "stdin" if path == "-" else path
        try:
            found = read(read_pasted(path, "a pasted output"))
        except ValueError as err:  # Unreadable, or the file's own sentence (which names it)
            err = Unreadable(str(err).removeprefix(f"{path}: "))
            print(f"moefleet p2p-check: {name}: {err}", file=sys.stderr)
            files.append({"file": name, "error": str(err)})
            unreadable = True
            continue
        files.append({"file": name, "kinds": sorted({item["kind"] for item in found}), "evidence": found,
                      "read": [describe(item) for item in found]})
        evidence += found
    verdict = decide(evidence, gpus) if evidence else None
    if verdict is not None:
        verdict["rule_table"] = {rule["id"]: rule for rule in RULES if rule["id"] in verdict["rules"]}
    if args.json:
        print(json.dumps({"files": files, "verdict": verdict}, indent=2))
    else:
        print(_text(files, verdict))
    if unreadable or verdict is None:
        return EXIT_BAD_INPUT
    return {VERDICT_P2P: EXIT_P2P, VERDICT_SHM: EXIT_SHM}.get(verdict["verdict"], EXIT_UNKNOWN)
