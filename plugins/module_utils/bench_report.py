"""The benchmark sweep's report and recommendation (issue 13): pure Python, standard library only.

playbooks/bench.yml serves each profile on one host and runs ``python -m sglang.bench_serving --output-file
X.jsonl`` at a concurrency ladder; the module moefleet.serving.bench_report (on the controller) hands the
fetched JSON lines to this file, which builds the report, picks a profile per objective and writes the
JSON, CSV, Markdown and (with matplotlib, imported inside ``write_plots`` only) PNG files.

Public API:

    results_from_jsonl(text) -> list[dict]           bench_results' reading of --output-file lines, by concurrency
    prompts_for(concurrency, minimum, per_concurrency, maximum) -> int   --num-prompts at one level
    recommend(profiles, slo_p99_itl_ms, slo_p99_ttft_ms) -> (names, details)
    build_report(host, model, profiles, slo_p99_itl_ms=None, slo_p99_ttft_ms=None, **more) -> dict
    csv_text(report) / markdown(report) -> str
    write_report(report, directory, stem, plots=True) -> {"json", "csv", "markdown", "plots", "plots_skipped"}

A profile is ``{"profile": name, "status": "ok"|"failed", "outcome": {...}, "error": str|None,
"results": [result, ...], ...}``; a result is a dict of bench_results.FIELDS (throughputs tok/s, latencies ms).
"""

from __future__ import annotations

import csv
import io
import json
import math
import os

from ansible_collections.moefleet.serving.plugins.module_utils.bench_results import FIELDS, parse_text

OBJECTIVES = ("single_stream", "throughput", "slo")
# CSV columns before the result fields.
CSV_LEAD = ("host", "model", "profile", "status")
CSV_FIELDS = ("max_concurrency",) + tuple(name for name in FIELDS if name != "max_concurrency")


class BenchReportError(ValueError):
    """Input the report cannot be built from; the message says what is wrong."""


def prompts_for(concurrency, minimum=8, per_concurrency=2, maximum=512):
    """--num-prompts at one level: ``min(maximum, max(minimum, ceil(per_concurrency * concurrency)))``."""
    wanted = math.ceil(float(per_concurrency) * int(concurrency))
    return int(min(int(maximum), max(int(minimum), wanted)))


def results_from_jsonl(text: str) -> list[dict]:
    """The JSON lines bench_serving appended to its --output-file, one result per line, by concurrency.

    Only JSON lines are read (a printed block in the same text is skipped); keys as bench_results.FIELDS."""
    results = []
    for parsed in parse_text(text):
        if parsed["kind"] != "jsonl":
            continue
        results.append({name: parsed[name] for name in FIELDS})
    return sorted(results, key=lambda r: (r["max_concurrency"] is None, r["max_concurrency"] or 0))


def _number(value):
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _ok(profiles):
    return [p for p in profiles if p.get("status") == "ok" and p.get("results")]


def _at(profile, concurrency):
    return next((r for r in profile["results"] if r.get("max_concurrency") == concurrency
                 and _number(r.get("output_throughput")) is not None), None)


def peak(profile):
    """The result with the highest output tok/s (the lowest concurrency among equals), or None."""
    best = None
    for result in profile.get("results") or []:
        value = _number(result.get("output_throughput"))
        if value is not None and (best is None or value > best["output_throughput"]):
            best = result
    return best


def meets_slo(result, slo_p99_itl_ms=None, slo_p99_ttft_ms=None):
    """Whether a result stays within the SLO (a bound that is None does not apply; a missing value fails)."""
    for bound, key in ((slo_p99_itl_ms, "p99_itl_ms"), (slo_p99_ttft_ms, "p99_ttft_ms")):
        if bound is None:
            continue
        value = _number(result.get(key))
        if value is None or value > bound:
            return False
    return True


def _detail(profile, result, reason):
    return {
        "profile": profile["profile"],
        "max_concurrency": result.get("max_concurrency"),
        "output_throughput": result.get("output_throughput"),
        "p99_itl_ms": result.get("p99_itl_ms"),
        "p99_ttft_ms": result.get("p99_ttft_ms"),
        "reason": reason,
    }


def _best(candidates):
    """The (profile, result) with the highest output tok/s; the first in sweep order among equals."""
    best = None
    for profile, result in candidates:
        if best is None or result["output_throughput"] > best[1]["output_throughput"]:
            best = (profile, result)
    return best


def recommend(profiles, slo_p99_itl_ms=None, slo_p99_ttft_ms=None):
    """Per objective, the profile to run: ``({objective: name|None}, {objective: detail})``.

    single_stream: the highest output tok/s at concurrency 1. throughput: the highest output tok/s at any
    measured concurrency (the peak aggregate). slo: the highest output tok/s among the results whose p99 ITL
    and p99 TTFT stay within the bounds given; None when none does or no bound is given. Failed profiles
    never win. A detail says the winning measurement, or why there is none, in ``reason``."""
    ok = _ok(profiles)
    names, details = {}, {}

    single = _best((p, r) for p in ok if (r := _at(p, 1)) is not None)
    if single:
        details["single_stream"] = _detail(*single, f"{single[1]['output_throughput']:.1f} tok/s at one request")
    else:
        details["single_stream"] = {"profile": None, "reason": "no profile was measured at concurrency 1"}

    top = _best((p, r) for p in ok if (r := peak(p)) is not None)
    if top:
        details["throughput"] = _detail(
            *top, f"{top[1]['output_throughput']:.1f} tok/s at concurrency {top[1].get('max_concurrency')}")
    else:
        details["throughput"] = {"profile": None, "reason": "no profile was measured"}

    slo_text = slo_sentence(slo_p99_itl_ms, slo_p99_ttft_ms)
    if slo_p99_itl_ms is None and slo_p99_ttft_ms is None:
        details["slo"] = {"profile": None, "reason": "no SLO given (bench_slo_p99_itl_ms, bench_slo_p99_ttft_ms)"}
    else:
        within = _best((p, r) for p in ok for r in p["results"]
                       if _number(r.get("output_throughput")) is not None
                       and meets_slo(r, slo_p99_itl_ms, slo_p99_ttft_ms))
        if within:
            details["slo"] = _detail(*within, f"{within[1]['output_throughput']:.1f} tok/s at concurrency "
                                              f"{within[1].get('max_concurrency')} within {slo_text}")
        else:
            details["slo"] = {"profile": None, "reason": f"no measurement stayed within {slo_text}"}

    for objective in OBJECTIVES:
        names[objective] = details[objective]["profile"]
    return names, details


def slo_sentence(slo_p99_itl_ms=None, slo_p99_ttft_ms=None):
    parts = []
    if slo_p99_itl_ms is not None:
        parts.append(f"p99 ITL <= {slo_p99_itl_ms:g} ms")
    if slo_p99_ttft_ms is not None:
        parts.append(f"p99 TTFT <= {slo_p99_ttft_ms:g} ms")
    return " and ".join(parts) if parts else "no SLO"


def _bound(value, name):
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise BenchReportError(f"{name} is {value!r}; give a number of milliseconds, or leave it unset.") from None
    if number != number or number <= 0:
        raise BenchReportError(f"{name} is {value!r}; give a positive number of milliseconds.")
    return number


def build_report(host, model, profiles, slo_p99_itl_ms=None, slo_p99_ttft_ms=None, **more):
    """The report: host, model, the profiles in sweep order, the SLO, the recommendation (and ``more`` keys)."""
    itl = _bound(slo_p99_itl_ms, "slo_p99_itl_ms")
    ttft = _bound(slo_p99_ttft_ms, "slo_p99_ttft_ms")
    rows = []
    for entry in profiles:
        if not isinstance(entry, dict) or not entry.get("profile"):
            raise BenchReportError(f"each profile needs a name under 'profile'; got {entry!r}.")
        status = entry.get("status")
        if status not in ("ok", "failed"):
            raise BenchReportError(f"profile {entry['profile']}: status is {status!r}; it must be 'ok' or 'failed'.")
        rows.append({**entry, "results": list(entry.get("results") or []), "outcome": entry.get("outcome") or {}})
    names, details = recommend(rows, itl, ttft)
    report = {"host": host, "model": model, **more, "slo": {"p99_itl_ms": itl, "p99_ttft_ms": ttft},
              "profiles": rows, "recommendation": names, "recommendation_detail": details}
    return report


def csv_text(report):
    """One row per profile and concurrency (a failed profile: one row with its status, no values)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*CSV_LEAD, *CSV_FIELDS])
    for profile in report["profiles"]:
        lead = [report.get("host"), report.get("model"), profile["profile"], profile["status"]]
        results = profile["results"] or [{}]
        for result in results:
            writer.writerow([*lead, *("" if result.get(k) is None else result.get(k) for k in CSV_FIELDS)])
    return out.getvalue()


def _fmt(value, spec=".1f"):
    return "–" if _number(value) is None else format(value, spec)


def _failure(profile):
    outcome = profile.get("outcome") or {}
    words = [profile.get("error") or ""]
    if not words[0]:
        state = outcome.get("state") or outcome.get("outcome") or "did not serve"
        words = [str(state)]
        if outcome.get("phase"):
            words.append(f"in {outcome['phase']}")
        if outcome.get("cause"):
            words.append(f"({outcome['cause']})")
    return " ".join(words).replace("|", "/")


def markdown(report):
    """The summary: per profile tok/s at one request, the peak aggregate, its concurrency and p99 ITL there."""
    lines = [f"# Benchmark sweep on {report.get('host')}: {report.get('model')}", ""]
    workload = report.get("workload") or {}
    if workload:
        ladder = ", ".join(str(c) for c in workload.get("ladder") or [])
        flags = f"--dataset-name {workload.get('dataset_name')}"
        if workload.get("dataset_path"):
            flags += f" --dataset-path {workload['dataset_path']}"
        if workload.get("tokenize_prompt"):
            flags += " --tokenize-prompt"
        target = f" against {workload['server_url']}" if workload.get("server_url") else ""
        lines.append(f"Workload: `{flags}`, {workload.get('input_len')} input and {workload.get('output_len')} "
                     f"output tokens per request, concurrency {ladder}{target}.")
    if report.get("started"):
        lines.append(f"Measured {report['started']} to {report.get('finished', '?')} (UTC).")
    lines += ["", "| profile | status | tok/s at 1 request | peak aggregate tok/s | at concurrency "
              "| p99 ITL at peak (ms) | p99 TTFT at peak (ms) |", "|---|---|---|---|---|---|---|"]
    for profile in report["profiles"]:
        if profile["status"] != "ok":
            lines.append(f"| {profile['profile']} | failed: {_failure(profile)} | – | – | – | – | – |")
            continue
        one = _at(profile, 1) or {}
        top = peak(profile) or {}
        lines.append(f"| {profile['profile']} | ok | {_fmt(one.get('output_throughput'))} "
                     f"| {_fmt(top.get('output_throughput'))} | {top.get('max_concurrency', '–')} "
                     f"| {_fmt(top.get('p99_itl_ms'))} | {_fmt(top.get('p99_ttft_ms'), '.0f')} |")
    slo = report.get("slo") or {}
    labels = {"single_stream": "Fastest single stream", "throughput": "Highest aggregate",
              "slo": f"Highest aggregate within {slo_sentence(slo.get('p99_itl_ms'), slo.get('p99_ttft_ms'))}"}
    lines += ["", "## Recommendation", ""]
    for objective in OBJECTIVES:
        detail = (report.get("recommendation_detail") or {}).get(objective) or {}
        name = detail.get("profile")
        lines.append(f"- {labels[objective]}: **{name}** ({detail.get('reason')})" if name
                     else f"- {labels[objective]}: none ({detail.get('reason')})")
    return "\n".join(lines) + "\n"


def write_plots(report, directory, stem):
    """PNG plots: output tok/s against concurrency per profile, and p99 TTFT and p99 ITL against concurrency.

    Returns ``(paths, None)``, or ``([], reason)`` when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        return [], "matplotlib is not installed on the controller (pip install matplotlib)"
    measured = _ok(report["profiles"])
    title = f"{report.get('model')} on {report.get('host')}"
    paths = []

    def series(profile, key):
        points = [(r["max_concurrency"], r[key]) for r in profile["results"]
                  if _number(r.get("max_concurrency")) is not None and _number(r.get(key)) is not None]
        return [x for x, _ in points], [y for _, y in points]

    levels = sorted({r["max_concurrency"] for p in measured for r in p["results"]
                     if _number(r.get("max_concurrency")) is not None})

    def axis(ax, ylabel):
        ax.set_xscale("log", base=2)
        if levels:  # the ladder's own levels as ticks (1, 4, 16, ...), not powers of two
            ax.set_xticks(levels, [str(c) for c in levels])
            ax.minorticks_off()
        ax.set_xlabel("max concurrency (requests)")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)

    fig = Figure(figsize=(8, 5), dpi=100)
    ax = fig.add_subplot()
    for profile in measured:
        xs, ys = series(profile, "output_throughput")
        ax.plot(xs, ys, marker="o", label=profile["profile"])
    axis(ax, "output tok/s")
    ax.set_title(f"Output throughput: {title}")
    if measured:
        ax.legend()
    fig.tight_layout()
    path = os.path.join(directory, f"{stem}-throughput.png")
    fig.savefig(path)
    paths.append(path)

    fig = Figure(figsize=(12, 5), dpi=100)
    for n, (key, label) in enumerate((("p99_ttft_ms", "p99 TTFT (ms)"), ("p99_itl_ms", "p99 ITL (ms)")), start=1):
        ax = fig.add_subplot(1, 2, n)
        for profile in measured:
            xs, ys = series(profile, key)
            ax.plot(xs, ys, marker="o", label=profile["profile"])
        axis(ax, label)
        ax.set_yscale("log")
        ax.set_title(f"{label}: {title}")
        if measured:
            ax.legend()
    fig.tight_layout()
    path = os.path.join(directory, f"{stem}-latency.png")
    fig.savefig(path)
    paths.append(path)
    return paths, None


def write_report(report, directory, stem, plots=True):
    """Write STEM.json, STEM.csv, STEM.md and the plots under ``directory`` (made if missing); their paths."""
    os.makedirs(directory, exist_ok=True)
    files = {}
    for key, suffix, text in (("json", ".json", json.dumps(report, indent=2) + "\n"),
                              ("csv", ".csv", csv_text(report)),
                              ("markdown", ".md", markdown(report))):
        path = os.path.join(directory, stem + suffix)
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        files[key] = path
    files["plots"], files["plots_skipped"] = write_plots(report, directory, stem) if plots else ([], "not asked")
    return files
