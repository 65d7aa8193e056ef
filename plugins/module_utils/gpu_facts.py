"""GPU facts from nvidia-smi's CSV output; pure parsing of text handed in (the module runs the command).

Expected query (docs/facts.md §5):
``nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version,compute_cap
--format=csv,noheader,nounits``
"""

from __future__ import annotations

import csv
import io
from typing import Any

QUERY_FIELDS = ("index", "name", "memory.total", "memory.used", "driver_version", "compute_cap")
NVIDIA_SMI_ARGS = ["nvidia-smi", "--query-gpu=" + ",".join(QUERY_FIELDS), "--format=csv,noheader,nounits"]


class GpuFactsError(ValueError):
    """nvidia-smi output the parser cannot read; the message is a sentence."""


def _mib(text: str, line: int) -> int:
    value = text.strip().removesuffix("MiB").strip()
    try:
        return int(float(value))
    except ValueError:
        raise GpuFactsError(
            f"nvidia-smi line {line}: memory {text.strip()!r} is not a number of MiB."
        ) from None


def parse_gpu_csv(text: str) -> list[dict[str, Any]]:
    """One dict per GPU from the query above (with or without units)."""
    gpus = []
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(QUERY_FIELDS):
            raise GpuFactsError(
                f"nvidia-smi line {number} has {len(row)} fields, expected {len(QUERY_FIELDS)} "
                f"({', '.join(QUERY_FIELDS)})."
            )
        index, name, total, used, driver, cap = (cell.strip() for cell in row)
        gpus.append(
            {
                "index": int(index),
                "name": name,
                "memory_total_mib": _mib(total, number),
                "memory_used_mib": _mib(used, number),
                "driver_version": driver,
                "compute_cap": cap,
            }
        )
    return gpus


def summarize(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Host-level facts: count, the (smallest) memory, the most used memory, and whether GPUs differ."""
    if not gpus:
        raise GpuFactsError("nvidia-smi listed no GPUs.")
    names = sorted({g["name"] for g in gpus})
    return {
        "count": len(gpus),
        "name": names[0] if len(names) == 1 else ", ".join(names),
        "uniform": len(names) == 1 and len({g["memory_total_mib"] for g in gpus}) == 1,
        "memory_total_mib": min(g["memory_total_mib"] for g in gpus),
        "memory_used_mib_max": max(g["memory_used_mib"] for g in gpus),
        "driver_version": gpus[0]["driver_version"],
        "driver_branch": int(gpus[0]["driver_version"].split(".")[0]) if gpus[0]["driver_version"] else None,
        "compute_cap": gpus[0]["compute_cap"],
        "gpus": gpus,
    }


COMPUTE_APPS_FIELDS = ("pid", "process_name", "used_memory")


def parse_compute_apps(text: str) -> list[dict[str, Any]]:
    """Processes holding GPU memory, from
    ``nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader,nounits``.
    One entry per (process, GPU) row, as nvidia-smi lists them."""
    apps = []
    for number, row in enumerate(csv.reader(io.StringIO(text)), start=1):
        if not row or not "".join(row).strip():
            continue
        if len(row) != len(COMPUTE_APPS_FIELDS):
            raise GpuFactsError(
                f"nvidia-smi compute-apps line {number} has {len(row)} fields, expected "
                f"{len(COMPUTE_APPS_FIELDS)} ({', '.join(COMPUTE_APPS_FIELDS)})."
            )
        pid, name, used = (cell.strip() for cell in row)
        apps.append({"pid": int(pid), "process_name": name, "used_memory_mib": _mib(used, number)})
    return apps
