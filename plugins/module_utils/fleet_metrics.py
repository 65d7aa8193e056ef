"""moefleet's own state and the GPUs' figures as Prometheus metrics, for node_exporter's textfile collector.

Pure Python, standard library only: the node_metrics role copies this file to each host (beside the exit hook's log
classifier) and its ``moefleet-textfile`` script writes what these functions return into node_exporter's textfile
directory; the unit tests and ``promtool check metrics`` read the same text.

- ``state_text``: what ``moefleet status`` sees in the local facts (ansible_local.moefleet, written by the
  sglang_service role after each run; ansible_local.moefleet_runtime, appended by the exit hook after each failure
  while serving), so alert rules see it too.
- ``gpu_text``: ``nvidia-smi --query-gpu`` figures and the kernel log's last Xid per GPU, under the DCGM exporter's
  names and labels (``DCGM_FI_DEV_GPU_TEMP{gpu, UUID, pci_bus_id, device, modelName, Hostname}``), so the same
  rules and dashboards work with either collector (docs/monitoring.md). The Xids are the fault watcher's reading of
  the kernel log (host_faults.classify_kernel, copied beside this file): ``last_xids`` takes its events.
- ``maintenance_text``: that a moefleet run (deploy, rollout, remediate) works on the host since when, for the
  alert rules' maintenance inhibition (the maintenance module writes it).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

# The failure states the exit hook records (sglang-runtime-exit): each is exported, 0 when none happened.
RUNTIME_STATES = ("oom", "crashed")
# nvidia-smi --query-gpu fields, in this order, and the DCGM exporter family each becomes (None: a label only).
SMI_FIELDS = ("index", "uuid", "name", "pci.bus_id", "temperature.gpu", "power.draw", "utilization.gpu",
              "memory.used", "memory.free")
GPU_FAMILIES = (
    ("DCGM_FI_DEV_GPU_TEMP", "temperature.gpu", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power.draw", "Power draw (in W)."),
    ("DCGM_FI_DEV_GPU_UTIL", "utilization.gpu", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_FB_USED", "memory.used", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_FREE", "memory.free", "Framebuffer memory free (in MiB)."),
)
# What a moefleet run that works on a host says it does (the maintenance module's reason).
MAINTENANCE_REASONS = ("deploy", "rollout", "remediate")
MAINTENANCE_FILE = "moefleet_maintenance.prom"


def escape(value: Any) -> str:
    """A label value as the text format writes it."""
    return str(value).replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def labels(pairs: Mapping[str, Any]) -> str:
    return "{" + ",".join(f'{k}="{escape(v)}"' for k, v in pairs.items()) + "}" if pairs else ""


def family(name: str, help_text: str, samples: Iterable[tuple[Mapping[str, Any], float]],
           kind: str = "gauge") -> list[str]:
    lines = [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}"]
    lines += [f"{name}{labels(pairs)} {_number(value)}" for pairs, value in samples]
    return lines


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def timestamp(text: str | None) -> float:
    """Seconds since the epoch of an ISO 8601 time the facts hold; 0 for none or one that does not parse."""
    if not text:
        return 0.0
    try:
        moment = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.timezone.utc)  # noqa: UP017 (hosts may run Python 3.10)
    return moment.timestamp()


FAULT_STATES = ("unfit", "hardware")


def state_text(local: Mapping[str, Any] | None, runtime: Mapping[str, Any] | None,
               health: Mapping[str, Any] | None = None) -> str:
    """The host's moefleet state (its local facts, runtime failures and the fault watcher's record) in the text
    format."""
    local, runtime, health = local or {}, runtime or {}, health or {}
    asked, serving, outcome = local.get("asked_profile"), local.get("serving_profile"), local.get("outcome")
    as_asked = 1 if local and outcome == "ready" and serving is not None and serving == asked else 0
    failures = [f for f in runtime.get("failures") or [] if isinstance(f, Mapping)]
    lines = family("moefleet_host_info",
                   "What moefleet's last run on the host recorded: the profile asked, the one serving, the outcome "
                   "(ready, degraded, restored, failed; none before the first run).",
                   [({"asked_profile": asked or "", "serving_profile": serving or "", "outcome": outcome or "none"},
                     1)])
    lines += family("moefleet_serving_as_asked",
                    "1 when the last run ended serving the profile it was asked (outcome ready), else 0.",
                    [({}, as_asked)])
    lines += family("moefleet_last_run_timestamp_seconds", "When the last run recorded its outcome (0: never).",
                    [({}, timestamp(local.get("updated")))])
    last_rollback = local.get("last_rollback") or {}
    lines += family("moefleet_last_rollback_timestamp_seconds",
                    "When a run last rolled back (a fallback profile or a restored unit; 0: never).",
                    [({}, timestamp(last_rollback.get("time")))])
    lines += family("moefleet_runtime_failures",
                    "Failures while serving the exit hook recorded (its last 20), by state: oom, crashed.",
                    [({"state": s}, sum(1 for f in failures if f.get("state") == s)) for s in RUNTIME_STATES])
    lines += family("moefleet_runtime_last_failure_timestamp_seconds",
                    "When the newest failure while serving of each state happened (0: none recorded).",
                    [({"state": s}, max((timestamp(f.get("time")) for f in failures if f.get("state") == s),
                                        default=0.0)) for s in RUNTIME_STATES])
    events = [e for e in health.get("events") or [] if isinstance(e, Mapping)]
    lines += family("moefleet_host_unfit",
                    "1 while the fault watcher keeps the host out (a GPU fault, a fatal PCIe error or a hang), by "
                    "state: unfit (until moefleet remediate) or hardware (it needs hardware attention), else 0.",
                    [({"state": s}, 1 if health.get("state") == s else 0) for s in FAULT_STATES])
    lines += family("moefleet_host_last_fault_timestamp_seconds",
                    "When the fault watcher last recorded an event that made the host unfit (0: none recorded).",
                    [({}, max((timestamp(e.get("time")) for e in events if e.get("unfit")), default=0.0))])
    return "\n".join(lines) + "\n"


def parse_smi_csv(text: str) -> list[dict[str, str]]:
    """Rows of ``nvidia-smi --query-gpu=<SMI_FIELDS> --format=csv,noheader,nounits``, by field."""
    rows = []
    for line in text.splitlines():
        if not line.strip():
            continue
        cells = [c.strip() for c in line.split(",")]
        if len(cells) != len(SMI_FIELDS):
            raise ValueError(f"nvidia-smi printed {len(cells)} fields where {len(SMI_FIELDS)} were asked: {line!r}")
        rows.append(dict(zip(SMI_FIELDS, cells, strict=True)))
    return rows


def last_xids(events: Iterable[Mapping[str, Any] | None]) -> dict[str, int]:
    """The last Xid per GPU, by its PCI bus (``17:00`` form, lower case), from the fault watcher's events of the
    kernel log's lines in order (host_faults.classify_kernel; None for a line that is no event)."""
    out: dict[str, int] = {}
    for event in events:
        if event and event.get("kind") == "xid" and event.get("pci") and event.get("code") is not None:
            out[_bus(str(event["pci"]))] = int(event["code"])
    return out


def maintenance_text(reason: str, started: float) -> str:
    """``moefleet_maintenance_start_timestamp_seconds{reason}``: when the run that works on the host started, 0 once
    it ended. One series per reason, always the same labels, so the rules' last_over_time sees an end as a 0."""
    if reason not in MAINTENANCE_REASONS:
        raise ValueError(f"maintenance reason {reason!r} is none of {', '.join(MAINTENANCE_REASONS)}")
    return "\n".join(family(
        "moefleet_maintenance_start_timestamp_seconds",
        "When the moefleet run working on the host (deploy, rollout, remediate) started; 0 when none is.",
        [({"reason": r}, started if r == reason else 0) for r in MAINTENANCE_REASONS])) + "\n"


def _bus(bus_id: str) -> str:
    """``00000000:17:00.0`` and ``0000:17:00`` both as ``17:00``."""
    parts = bus_id.lower().split(":")
    return ":".join(p.split(".")[0] for p in parts[-2:])


def gpu_text(rows: Sequence[Mapping[str, str]], xids: Mapping[str, int], hostname: str, ok: bool = True) -> str:
    """The GPUs' figures under the DCGM exporter's names (one sample per GPU), the last Xid per GPU (0: none since
    boot) and whether nvidia-smi answered (``moefleet_gpu_collector_success``: a GPU that hangs nvidia-smi is a
    fault too)."""
    lines: list[str] = []
    ids = [{"gpu": r["index"], "UUID": r["uuid"], "pci_bus_id": r["pci.bus_id"], "device": f"nvidia{r['index']}",
            "modelName": r["name"], "Hostname": hostname} for r in rows]
    for name, field, help_text in GPU_FAMILIES:
        samples = [(i, float(r[field])) for i, r in zip(ids, rows, strict=True) if _is_number(r[field])]
        if samples:
            lines += family(name, help_text, samples)
    if rows:
        lines += family("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered (0: none since boot).",
                        [(i, xids.get(_bus(r["pci.bus_id"]), 0)) for i, r in zip(ids, rows, strict=True)])
    lines += family("moefleet_gpu_collector_success", "1 when nvidia-smi answered the last collection, else 0.",
                    [({}, 1 if ok else 0)])
    lines += family("moefleet_gpus", "GPUs nvidia-smi listed at the last collection.", [({}, len(rows))])
    return "\n".join(lines) + "\n"


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
