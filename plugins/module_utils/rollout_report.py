"""The rollout report's logic, shared by the report callback (plugins/callback/moefleet_report.py, which collects
a run's events into a report) and the CLI (moefleet rollout --check writes a planned report; moefleet rollout
and deploy read one): secrets kept out of it (redact, scrub), the collection's version, the next steps when a
fleet is left mixed, and the report rendered as a terminal table and as Markdown. Plain Python, run on the
controller only.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from ansible_collections.moefleet.serving.plugins.module_utils import sglang_releases


def one_line(text: object) -> str:
    """The text on one line, whole: advice is never cut (a cut one read "so a higher --m...")."""
    return " ".join(str(text).split())


# An extra variable whose name says it holds a secret is never written, at any depth: a part of its name (split at
# _ - .) that ends in token, key or keys (hf_token, api_key, apikey) or holds password, secret, vault or credential.
# Not a count such as max_total_tokens: its value would then also be scrubbed out of every message.
_SECRET_PART = re.compile(r"(token|key|keys)$|password|passwd|secret|vault|credential", re.IGNORECASE)


def secret_name(key: str) -> bool:
    return any(_SECRET_PART.search(part) for part in re.split(r"[_.\-]+", key) if part)


REDACTED = "<redacted>"


def _vaulted(value: object) -> bool:
    """Whether the value came from vault (encrypted, or decrypted and still tagged so)."""
    if type(value).__name__ in ("EncryptedString", "AnsibleVaultEncryptedUnicode") or hasattr(value, "_ciphertext"):
        return True
    if isinstance(value, str) and value.lstrip().startswith("$ANSIBLE_VAULT;"):
        return True
    try:
        from ansible.parsing.vault import VaultHelper

        return VaultHelper.get_ciphertext(value, with_tags=True) is not None
    except Exception:  # noqa: BLE001 - older ansible-core, or a value it cannot look into: not vaulted
        return False


def redact(value: object, secrets: set[str], key: str = "") -> object:
    """A plain JSON copy of value with secrets replaced by REDACTED; the secret strings are added to secrets."""
    if (key and secret_name(key)) or _vaulted(value):
        _collect_strings(value, secrets)
        return REDACTED
    if isinstance(value, dict):
        return {str(k): redact(v, secrets, str(k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, secrets) for v in value]
    if value is None or isinstance(value, (bool, int, float)):
        return value
    return str(value)


def _collect_strings(value: object, secrets: set[str]) -> None:
    if isinstance(value, dict):
        for item in value.values():
            _collect_strings(item, secrets)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _collect_strings(item, secrets)
    elif value is not None and not isinstance(value, bool):
        try:
            text = str(value)
        except Exception:  # noqa: BLE001 - a vaulted value that cannot be decrypted here is not in any message
            return
        if len(text) >= 4:
            secrets.add(text)


def scrub(text: str, secrets: set[str]) -> str:
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    return text


def collection_version() -> str | None:
    """moefleet.serving's version: galaxy.yml in a clone, MANIFEST.json in an installed collection."""
    root = Path(__file__).resolve().parents[2]
    try:
        match = re.search(r"^version:\s*['\"]?([^'\"\s#]+)", (root / "galaxy.yml").read_text(encoding="utf-8"), re.M)
        if match:
            return match.group(1)
    except OSError:
        pass
    try:
        return str(json.loads((root / "MANIFEST.json").read_text(encoding="utf-8"))["collection_info"]["version"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def run_kind(report: dict) -> str:
    """What the report is of, by its playbook: "deploy" (deploy.yml, moefleet deploy) or "rollout"."""
    return "deploy" if report.get("playbook") == "deploy.yml" else "rollout"


def _command(report: dict, profile: str | None, hosts: list[str], release: str | None = None) -> str:
    """The command that runs this report's kind of run again on ``hosts``; with ``release``, `moefleet upgrade --to`
    it (an upgrade's run, resumed or undone: a plain rollout would install the release the inventory pins)."""
    words = ["moefleet", "upgrade" if release else run_kind(report)]
    for source in report.get("inventory") or []:
        words += ["-i", source]
    if release:
        words += ["--to", release]
    if profile:
        words += ["-e", f"profile={profile}"]
    words += ["--limit", ",".join(hosts)]
    return " ".join(shlex.quote(word) for word in words)


def _upgraded_to(report: dict) -> str | None:
    """The SGLang release the run moved hosts to (-e sglang_package_spec, as `moefleet upgrade --to` passes it)."""
    return sglang_releases.release_of((report.get("extra_vars") or {}).get("sglang_package_spec"))


def next_steps(report: dict, previous: dict[str, str]) -> list[str]:
    """When the fleet is left mixed: which hosts serve what, and the commands to resume or to roll back."""
    rows = report["hosts"]
    behind = [row for row in rows if row["outcome"] != "ready" or row["serving_profile"] != row["asked_profile"]]
    if not behind:
        return []
    serving: dict[str, list[str]] = {}
    for row in rows:
        serving.setdefault(row["serving_profile"] or "", []).append(row["host"])
    parts = [f"{profile} on {', '.join(hosts)}" for profile, hosts in serving.items() if profile]
    if "" in serving:
        parts.append(f"nothing known to serve on {', '.join(serving[''])}")
    steps = ["Serving now: " + "; ".join(parts) + "."]
    per_host = "profile" not in (report.get("extra_vars") or {})
    profile = None if per_host else report.get("asked_profile")
    broken = [row["host"] for row in behind if row["outcome"] in ("failed", "restored", "degraded", "unreachable")]
    if broken:
        steps.append(
            f"First find out why {', '.join(broken)} did not end on the asked profile: their messages above, "
            "moefleet status, and moefleet diagnose on the host's journal "
            "(journalctl -u sglang.service -o export > sglang.export)."
        )
    release = _upgraded_to(report)
    steps.append(
        f"To resume ({', '.join(row['host'] for row in behind)} to "
        f"{'each host profile' if per_host else profile}{f' on SGLang {release}' if release else ''}): "
        f"{_command(report, profile, [row['host'] for row in behind], release)}"
    )
    # An upgrade's hosts that kept the new release: the way back is the old release, at the profile they serve.
    kept: dict[tuple[str, str], list[str]] = {}
    for row in rows:
        compared = row.get("release_compare") or {}
        old = (compared.get("before") or {}).get("release")
        if release and row["outcome"] == "ready" and compared.get("verdict") != "slower" and old and old != release:
            kept.setdefault((old, row["serving_profile"]), []).append(row["host"])
    for (old, serving_now), hosts in kept.items():
        steps.append(f"To move {', '.join(hosts)} back to SGLang {old}: "
                     f"{_command(report, None if per_host else serving_now, hosts, old)}")
    moved = [
        row
        for row in rows
        if row["outcome"] in ("ready", "degraded")
        and row["serving_profile"] != previous.get(row["host"])
        and row["started"] is not None
    ]
    back: dict[str, list[str]] = {}
    for row in moved:
        back.setdefault(previous.get(row["host"]) or "", []).append(row["host"])
    for before, hosts in back.items():
        if before:
            steps.append(f"To roll {', '.join(hosts)} back to {before}: {_command(report, before, hosts)}")
        else:
            steps.append(f"{', '.join(hosts)} served nothing known before this run: no profile to roll back to.")
    return steps


_COLUMNS = (
    ("host", "host"),
    ("asked", "asked_profile"),
    ("serving", "serving_profile"),
    ("outcome", "outcome"),
    ("OOMs", "ooms"),
    ("seconds", "seconds"),
    ("batch", "batch"),
)
_RIGHT = frozenset({"ooms", "seconds"})
_OUTCOME_NOTES = {"untouched": "untouched (never reached: later batch)"}


def _columns(report: dict) -> list[tuple[str, str]]:
    """The table's columns; batch only when the run knew the batches."""
    with_batch = any(row.get("batch") is not None for row in report["hosts"])
    return [(title, key) for title, key in _COLUMNS if key != "batch" or with_batch]


def _cells(row: dict, columns: list[tuple[str, str]] | None = None) -> list[str]:
    cells = []
    for _, key in columns or _COLUMNS:
        value = row.get(key)
        if key == "outcome" and str(row.get("message") or "").startswith("refused at confirmation"):
            value = f"{value} (refused at confirmation)"
        elif key == "outcome":
            value = _OUTCOME_NOTES.get(value, value)
        if key == "batch" and value is not None and row.get("canary"):
            value = f"{value} (canary)"
        cells.append("-" if value is None or value == "" else str(value))
    return cells


def _headline(report: dict) -> str:
    hosts = report["hosts"]
    done = sum(1 for row in hosts if row["outcome"] == "ready")
    line = (
        f"{run_kind(report).capitalize()} of {report['asked_profile'] or 'each host profile'}: {report['result']}, "
        f"{done}/{len(hosts)} host(s) serve the asked profile, {report['seconds']} s."
    )
    return line + (f" ({report['stopped_by']})" if report.get("stopped_by") else "")


def render_text(report: dict) -> str:
    """The summary table for a terminal."""
    columns = _columns(report)
    header = [title for title, _ in columns]
    body = [_cells(row, columns) for row in report["hosts"]]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    right = [key in _RIGHT for _, key in columns]

    def fmt(line: list[str]) -> str:
        cells = (c.rjust(w) if r else c.ljust(w) for c, w, r in zip(line, widths, right, strict=True))
        return "  ".join(cells).rstrip()

    lines = [_headline(report), fmt(header), fmt(["-" * w for w in widths]), *(fmt(line) for line in body)]
    lines += [f"{row['host']}: {row['message']}" for row in report["hosts"] if row.get("message")]
    compared = releases_compared(report)
    if compared:
        lines += ["SGLang releases, old against new (best run of each):", *(f"  {line}" for line in compared)]
    verdicts = p2p_verdicts(report)
    if verdicts:
        lines += ["PCIe peer-to-peer preflight:", *(f"  {line}" for line in verdicts)]
    if report.get("next_steps"):
        lines += ["Next steps:", *(f"  {step}" for step in report["next_steps"])]
    return "\n".join(lines)


def releases_compared(report: dict) -> list[str]:
    """One line per host whose run replaced its SGLang release: both releases' figures and the verdict."""
    lines = []
    for row in report["hosts"]:
        compared = row.get("release_compare")
        if not isinstance(compared, dict):
            continue
        old = (compared.get("before") or {}).get("release") or "?"
        new = (compared.get("after") or {}).get("release") or "?"
        figures = []
        for metric, label, unit in (("output_tok_s", "output", "tok/s"), ("ttft_ms", "TTFT", "ms")):
            m = (compared.get("metrics") or {}).get(metric)
            if m:
                figures.append(f"{label} {m['before']} -> {m['after']} {unit} ({m['change']:+.0%}, noise "
                               f"{m['noise']:.0%})")
        verdict = {"slower": "slower: switched back", "not_slower": "not slower: kept",
                   "unmeasured": "not measured"}.get(compared.get("verdict"), compared.get("verdict"))
        lines.append(f"{row['host']}: {old} -> {new}: {'; '.join(figures) or compared.get('reason', '')} [{verdict}]")
    return lines


def p2p_verdicts(report: dict) -> list[str]:
    """One line per host whose run ran the P2P preflight: the verdict, the set served, the bandwidths; the reason and
    the fix when P2P was not kept, or the contradiction with a pinned set."""
    lines = []
    for row in report["hosts"]:
        p2p = row.get("p2p")
        if not isinstance(p2p, dict):
            continue
        bw = p2p.get("bandwidths") or {}
        labels = (("p2p_busbw_gbps", "with P2P"), ("shm_busbw_gbps", "without"))
        figures = ", ".join(f"{bw[key]:g} GB/s {label}" for key, label in labels
                            if isinstance(bw.get(key), (int, float)))
        line = (f"{row['host']}: {p2p.get('verdict')}{' (cached)' if p2p.get('cached') else ''}, serving "
                f"{p2p.get('nccl_set') or 'nothing'}" + (f" ({figures})" if figures else ""))
        if p2p.get("contradiction"):
            line += f"; {p2p['contradiction']}"
        elif p2p.get("verdict") != "pcie_p2p":
            line += f"; {p2p.get('reason')}"
        if p2p.get("verdict") != "pcie_p2p" and p2p.get("fix"):
            line += f" Fix: {p2p['fix']}"
        lines.append(line)
    return lines


def _md(text: object) -> str:
    """Text for a Markdown table cell or list item: pipes escaped, commands kept whole."""
    return str(text).replace("|", "\\|")


def render_markdown(report: dict) -> str:
    columns = _columns(report)
    header = [title for title, _ in columns]
    lines = [
        f"# {run_kind(report).capitalize()} report: {report.get('asked_profile') or 'each host profile'}",
        "",
        f"- Result: **{report.get('result')}**" + (f" ({report['stopped_by']})" if report.get("stopped_by") else ""),
        f"- Started: {report.get('started')}; ended: {report.get('ended')} ({report.get('seconds')} s)",
        f"- Playbook: {report.get('playbook')}",
    ]
    if report.get("inventory"):
        lines.append("- Inventory: " + ", ".join(f"`{source}`" for source in report["inventory"]))
    if report.get("extra_vars"):
        lines.append(f"- Extra vars (`-e`, secrets redacted): `{json.dumps(report['extra_vars'], sort_keys=True)}`")
    if report.get("moefleet_version"):
        lines.append(f"- moefleet.serving: {report['moefleet_version']}")
    lines += [
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---:" if key in _RIGHT else "---" for _, key in columns) + "|",
    ]
    lines += ["| " + " | ".join(_md(cell) for cell in _cells(row, columns)) + " |" for row in report["hosts"]]
    notes = [f"- {row['host']}: {row['message']}" for row in report["hosts"] if row.get("message")]
    if notes:
        lines += ["", "## Notes", "", *notes]
    compared = releases_compared(report)
    if compared:
        lines += ["", "## SGLang releases, old against new", "", *(f"- {_md(line)}" for line in compared)]
    verdicts = p2p_verdicts(report)
    if verdicts:
        lines += ["", "## PCIe peer-to-peer preflight", "", *(f"- {_md(line)}" for line in verdicts)]
    if report.get("next_steps"):
        lines += ["", "## Next steps", ""]
        for step in report["next_steps"]:
            # A command after ": moefleet rollout" (or deploy) is set as code, whole, so that it pastes as it is.
            head, sep, command = step.partition(f": moefleet {run_kind(report)}")
            lines.append(f"- {head}: `moefleet {run_kind(report)}{command}`" if sep else f"- {step}")
    return "\n".join(lines) + "\n"
