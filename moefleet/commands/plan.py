"""moefleet plan: what each profile (or an ad-hoc layout) puts on every GPU, and whether it fits."""

from __future__ import annotations

import argparse
import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any

from ansible_collections.moefleet.serving.plugins.module_utils import gpu_memory as gpu_table
from ansible_collections.moefleet.serving.plugins.module_utils import planner, profiles, sglang_releases

from moefleet import collection
from moefleet.commands import number_problem, whole_number_problem

DEFAULT_CATALOG = collection.CATALOG
DEFAULT_SCHEMA = collection.SCHEMA


def _pinned_release() -> str:
    """The release the fleet's defaults pin (roles/moefleet_defaults: sglang_package_spec)."""
    import yaml

    home = collection.ROOT / "roles" / "moefleet_defaults" / "defaults" / "main.yml"
    spec = (yaml.safe_load(home.read_text()) or {}).get("sglang_package_spec") if home.is_file() else None
    return sglang_releases.release_of(spec) or sglang_releases.SUPPORTED[0]


EXIT_OK, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2
LAYOUT = ("tp", "ep", "pp", "dp")  # the ad-hoc layout's options, each SGLang's --<name>-size
GPU_MEMORY_GIB_MAX = 1024  # per GPU; the largest board in the known-GPU table has 178 GiB


class BadInput(Exception):
    """Input the command cannot use; the message is the one line printed to stderr."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="predict per-GPU weights, KV cache and a verdict for each profile",
        description=(
            "Predict, from the model's config.json, what each catalog profile (or one ad-hoc layout) puts "
            "on every GPU, how many KV-cache tokens are left, and whether it fits. Exit 0 when every "
            "planned layout fits or is tight, 1 when one does not, 2 on bad input."
        ),
    )
    parser.add_argument(
        "--model-config", required=True, type=Path, metavar="FILE", help="the model's config.json"
    )
    parser.add_argument("--gpus", type=int, default=8, metavar="N", help="GPUs on the host (default: 8)")
    gpu = parser.add_argument_group(
        "the GPU (give one of --gpu, --gpu-memory-mib or --gpu-memory-gib)",
        "nvidia-smi's memory.total (MiB) and PyTorch's total capacity (GiB) differ by what the driver "
        "reserves: 97887 MiB is 95.59 GiB, PyTorch sees 94.97 GiB on an RTX PRO 6000. SGLang sizes its "
        "default --mem-fraction-static from the first and its KV pool from the second.",
    )
    gpu.add_argument(
        "--gpu",
        metavar="NAME",
        help="a known GPU, by name or nvidia-smi's name column: "
        + ", ".join(repr(g.name) for g in gpu_table.KNOWN_GPUS)
        + " (short names such as 'RTX PRO 6000', 'H100', 'H200', 'B200' work)",
    )
    gpu.add_argument(
        "--gpu-memory-mib",
        type=float,
        metavar="MIB",
        help="memory.total per GPU as nvidia-smi prints it (97887 for an RTX PRO 6000); PyTorch's capacity "
        "comes from the known-GPU table, or from --gpu-memory-gib",
    )
    gpu.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="X",
        help="PyTorch's total capacity per GPU in GiB (torch.cuda.get_device_properties(0).total_memory / 2**30; "
        "94.97 for an RTX PRO 6000), as its OOM messages print it ('a total capacity of 94.97 GiB')",
    )
    gpu.add_argument(
        "--gpu-memory-total-mib",
        type=float,
        metavar="MIB",
        help="the same as --gpu-memory-mib (the older spelling)",
    )
    parser.add_argument(
        "names",
        nargs="*",
        metavar="PROFILE",
        help="plan only these profiles (as --profile); default: every catalog profile",
    )
    parser.add_argument(
        "--profile", action="append", default=[], metavar="NAME", help="plan only this profile (repeatable)"
    )
    layout = parser.add_argument_group("ad-hoc layout (SGLang's flags; the short spellings work too)")
    layout.add_argument("--tp-size", "--tp", dest="tp", type=int, metavar="N", help="SGLang's --tp-size")
    layout.add_argument("--ep-size", "--ep", dest="ep", type=int, metavar="N", help="SGLang's --ep-size")
    layout.add_argument("--pp-size", "--pp", dest="pp", type=int, metavar="N", help="SGLang's --pp-size")
    layout.add_argument("--dp-size", "--dp", dest="dp", type=int, metavar="N", help="SGLang's --dp-size")
    layout.add_argument(
        "--enable-dp-attention", "--dp-attention", dest="dp_attention", action="store_true",
        help="SGLang's --enable-dp-attention",
    )
    parser.add_argument(
        "--catalog", type=Path, default=DEFAULT_CATALOG, metavar="FILE", help="profile catalog"
    )
    parser.add_argument(
        "--extra-profiles", type=Path, metavar="FILE", help="operator profiles (YAML) laid over the catalog"
    )
    parser.add_argument(
        "--release", default=_pinned_release(), choices=sglang_releases.SUPPORTED,
        help="the SGLang release whose default memory fraction and reserve to reproduce (default: %(default)s, the "
        "one sglang_package_spec pins in roles/moefleet_defaults)",
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.add_argument(
        "--plot",
        type=Path,
        metavar="FILE.png",
        help="also draw, per profile, one GPU's memory as a stacked bar (weights by part, KV pool, what SGLang "
        "keeps for activations and CUDA graphs, the rest) into FILE.png (needs matplotlib)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        gpu = resolve_gpu(args)
        rows = plan_rows(args, gpu)
        if args.plot:
            draw_plot(rows, gpu, args.plot)
    except (BadInput, planner.PlanError, profiles.ProfileError) as exc:
        print(f"moefleet plan: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(rows, indent=2) if args.json else render_table(rows, args.gpus, gpu))
    if args.plot:
        print(f"moefleet plan: drew {args.plot}", file=sys.stderr)
    return EXIT_OK if all(row["verdict"] in ("fits", "tight") for row in rows) else EXIT_DOES_NOT_FIT


def resolve_gpu(args: argparse.Namespace) -> dict[str, Any]:
    """The GPU the plan is for: ``{name, smi_mib, gib}`` from --gpu, --gpu-memory-mib (through the known-GPU
    table, the conversion the preflight uses) and/or --gpu-memory-gib; a problem names the flag."""
    low, high = profiles.GPU_COUNT_BOUNDS
    mib_flag = "--gpu-memory-mib" if args.gpu_memory_mib is not None else "--gpu-memory-total-mib"
    problems = [
        whole_number_problem("--gpus", args.gpus, low, high),
        number_problem("--gpu-memory-gib", args.gpu_memory_gib, GPU_MEMORY_GIB_MAX, "94.97"),
        number_problem("--gpu-memory-mib", args.gpu_memory_mib, GPU_MEMORY_GIB_MAX * 1024, "97887"),
        number_problem("--gpu-memory-total-mib", args.gpu_memory_total_mib, GPU_MEMORY_GIB_MAX * 1024, "97887"),
        *(whole_number_problem(f"--{k}", getattr(args, k), *profiles.FLAG_BOUNDS[f"{k}_size"]) for k in LAYOUT),
    ]
    problem = next((p for p in problems if p), None)
    if problem:
        raise BadInput(problem)
    if args.gpu_memory_mib is not None and args.gpu_memory_total_mib is not None:
        raise BadInput("--gpu-memory-mib and --gpu-memory-total-mib are the same figure; give one.")
    smi_mib = args.gpu_memory_mib if args.gpu_memory_mib is not None else args.gpu_memory_total_mib
    gib = args.gpu_memory_gib
    if args.gpu:
        if smi_mib is not None or gib is not None:
            raise BadInput(
                f"--gpu {args.gpu!r} already gives both memory figures; drop --gpu-memory-gib/--gpu-memory-mib, "
                "or drop --gpu to give them yourself."
            )
        try:
            known = gpu_table.find_gpu(args.gpu)
        except gpu_table.UnknownGpu as exc:
            raise BadInput(f"--gpu: {exc}") from None
        return {"name": known.name, "smi_mib": float(known.smi_total_mib), "gib": known.torch_total_gib}
    if smi_mib is None and gib is None:
        raise BadInput(
            "Say which GPU: --gpu 'RTX PRO 6000' (known: "
            + ", ".join(repr(g.name) for g in gpu_table.KNOWN_GPUS)
            + "), or --gpu-memory-mib N with nvidia-smi's memory.total (nvidia-smi --query-gpu=memory.total "
            "--format=csv)."
        )
    if gib is None:
        try:
            gib = gpu_table.torch_capacity_gib(smi_mib)
        except gpu_table.UnknownGpu as exc:
            raise BadInput(f"{mib_flag}: {exc}") from None
    if smi_mib is not None and smi_mib < gib * 1024:
        raise BadInput(
            f"{mib_flag} is nvidia-smi's memory.total, at least --gpu-memory-gib x 1024 "
            "(97887 for an RTX PRO 6000 whose PyTorch capacity is 94.97 GiB)."
        )
    known = gpu_table.gpu_for_smi_total(smi_mib) if smi_mib is not None else None
    name = known.name if known is not None and known.torch_total_gib == gib else None
    return {"name": name, "smi_mib": smi_mib, "gib": gib}


def _squash(name: str) -> str:
    return re.sub(r"[\s_.-]+", "", name.lower())


def _profile_names(args: argparse.Namespace, catalog: dict[str, Any]) -> list[str]:
    """The profiles asked for (positional names and --profile); a near miss (tp2-ep4, TP2EP4, tp2_ep4) is
    refused with the name it probably meant."""
    names = profiles.profile_names(catalog)
    wanted = [*args.names, *args.profile]
    for name in wanted:
        if name in names:
            continue
        squashed = {_squash(n): n for n in names}
        close = [squashed[_squash(name)]] if _squash(name) in squashed else difflib.get_close_matches(name, names, n=2)
        if close:
            raise BadInput(
                f"Unknown profile {name!r}; did you mean {' or '.join(close)}? valid profiles: {', '.join(names)}."
            )
        profiles.resolve_profile(catalog, name)  # raises with the list of valid names
    return wanted or names


def _literal_name_hint(flags: dict[str, Any], catalog: dict[str, Any]) -> str:
    """A catalog profile whose name is this ad-hoc layout read literally (--tp 2 --ep 4 -> tp2ep4) but whose
    flags differ: the operator probably meant the profile."""
    literal = "".join(f"{k}{flags[f'{k}_size']}" for k in LAYOUT if f"{k}_size" in flags)
    if flags.get("enable_dp_attention"):
        literal += "dpa"
    profile = (catalog.get("profiles") or {}).get(literal)
    if not profile:
        return ""
    mine = planner.Layout.from_flags(flags)
    theirs = planner.Layout.from_flags(profile["flags"])
    if (mine.tp, mine.ep, mine.pp, mine.dp, mine.dp_attention) == (
        theirs.tp, theirs.ep, theirs.pp, theirs.dp, theirs.dp_attention
    ):
        return ""
    return (
        f"Did you mean profile {literal} ({theirs.cli()})? Profile names count GPUs per group as operators say "
        f"them; SGLang's --tp-size counts every GPU the experts are split over: moefleet plan {literal}."
    )


def plan_rows(args: argparse.Namespace, gpu: dict[str, Any]) -> list[dict[str, Any]]:
    config = _read_json(args.model_config, "model config")
    catalog = load_catalog(args.catalog, args.extra_profiles)
    adhoc = any(v is not None for v in (args.tp, args.ep, args.pp, args.dp)) or args.dp_attention
    hint = ""
    if adhoc:
        if args.profile or args.names:
            raise BadInput("Give either --profile or an ad-hoc layout (--tp/--ep/--pp/--dp), not both.")
        flags: dict[str, Any] = {"tp_size": args.tp or 1}
        for key, value in (("ep_size", args.ep), ("pp_size", args.pp), ("dp_size", args.dp)):
            if value is not None:
                flags[key] = value
        if args.dp_attention:
            flags["enable_dp_attention"] = True
        layouts = [("ad-hoc", flags)]
        hint = _literal_name_hint(flags, catalog)
    else:
        names = _profile_names(args, catalog)
        layouts = [(name, profiles.resolve_profile(catalog, name)["flags"]) for name in names]
    rows = []
    for name, result in planner.plan_many(
        config, args.gpus, gpu["gib"], layouts, catalog["profiles"], gpu["smi_mib"], release=args.release
    ):
        row = {"profile": name, **result.to_dict()}
        if hint and "Did you mean" not in row["reason"]:
            row["reason"] = f"{row['reason']} {hint}"
        rows.append(row)
    return rows


def load_catalog(path: Path, extra_path: Path | None) -> dict[str, Any]:
    """Read, merge and validate the catalog (schema, then invariants and fallback ladders); a problem
    names the file and line it was written at."""
    catalog, origins = profiles.load_yaml_lines(_read_text(path, "profile catalog"), str(path))
    extra, extra_origins = None, {}
    if extra_path:
        extra, extra_origins = profiles.load_yaml_lines(_read_text(extra_path, "extra profiles"), str(extra_path))
    merged = profiles.merge_catalog(catalog, extra)
    schema = _read_json(DEFAULT_SCHEMA, "catalog schema")
    profiles.validate_catalog(merged, schema, profiles.catalog_origins(origins, extra, extra_origins))
    return merged


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BadInput(f"The {what} {path} does not exist.") from None
    except OSError as exc:
        raise BadInput(f"The {what} {path} cannot be read: {exc.strerror}.") from None


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(_read_text(path, what))
    except json.JSONDecodeError as exc:
        raise BadInput(f"The {what} {path} is not valid JSON (line {exc.lineno}: {exc.msg}).") from None


def render_table(rows: list[dict[str, Any]], gpus: int, gpu: dict[str, Any]) -> str:
    header = ("profile", "flags", "gpus", "weights/GPU", "mem fraction", "KV tokens", "verdict")
    body = [
        (
            row["profile"],
            planner.Layout.from_flags(row["flags"]).cli(),
            f"{row['gpus_used']}/{gpus}",
            # from the bytes, as the sentence below does (planner._gib), so both round alike
            f"{row['weights_bytes_per_gpu'] / planner.GIB:.1f} GiB" if row["weights_bytes_per_gpu"] else "-",
            f"{row['mem_fraction_static']:.3f}" if row["mem_fraction_static"] else "-",
            f"{row['kv_tokens']:,}",
            row["verdict"],
        )
        for row in rows
    ]
    widths = [max(len(str(line[i])) for line in [header, *body]) for i in range(len(header))]
    right = {2, 3, 4, 5}

    def fmt(line: tuple[str, ...]) -> str:
        cells = [
            str(c).rjust(w) if i in right else str(c).ljust(w)
            for i, (c, w) in enumerate(zip(line, widths, strict=True))
        ]
        return "  ".join(cells).rstrip()

    lines = [f"{gpus} GPUs x {describe_gpu(gpu)}", fmt(header), fmt(tuple("-" * w for w in widths))]
    lines += [fmt(line) for line in body]
    lines.append("")
    lines += [f"{row['profile']}: {row['reason']}" for row in rows]
    return "\n".join(lines)


def describe_gpu(gpu: dict[str, Any]) -> str:
    """``RTX PRO 6000 Blackwell Server Edition (97,887 MiB in nvidia-smi, 94.97 GiB in PyTorch)``."""
    figures = f"{gpu['gib']:g} GiB in PyTorch"
    if gpu["smi_mib"] is not None:
        figures = f"{gpu['smi_mib']:,.0f} MiB in nvidia-smi, {figures}"
    return f"{gpu['name']} ({figures})" if gpu["name"] else figures


# The plot's segments, bottom to top: what one GPU's memory holds once SGLang has started.
PLOT_COLOURS = {
    "KV pool": "#2ca02c",
    "activations and CUDA graphs": "#ff7f0e",
    "CUDA context, NCCL (estimate)": "#7f7f7f",
    "free": "#ffffff",
    "driver reserved": "#d9d9d9",
}


def memory_segments(row: dict[str, Any], gpu: dict[str, Any]) -> list[tuple[str, float]]:
    """One GPU of ``row``'s layout as ``(label, GiB)`` segments summing to its memory (nvidia-smi's total when
    known, else PyTorch's): weights by part (the heaviest stage), the KV pool, what stays outside SGLang's
    static pool for activations and CUDA graphs, the context the planner counts before the pool, the rest
    free, and what the driver keeps out of PyTorch's reach."""
    gib = planner.GIB
    total = gpu["gib"]
    segments = [(f"weights: {part.replace('_', ' ')}", b / gib) for part, b in row["weights_breakdown"].items() if b]
    free_at_init = row["free_bytes_per_gpu"] / gib
    kv = row["kv_pool_bytes"] / gib
    static = free_at_init * row["mem_fraction_static"] if row["mem_fraction_static"] else 0.0
    used = sum(v for _, v in segments) + kv
    activations = max(min(free_at_init - static, total - used), 0.0) if static else 0.0
    overhead = min(planner.INIT_OVERHEAD_GIB, max(total - used - activations, 0.0)) if static else 0.0
    segments += [
        ("KV pool", kv),
        ("activations and CUDA graphs", activations),
        ("CUDA context, NCCL (estimate)", overhead),
        ("free", max(total - used - activations - overhead, 0.0)),
    ]
    if gpu["smi_mib"] is not None:
        segments.append(("driver reserved", max(gpu["smi_mib"] / 1024 - total, 0.0)))
    return segments


def draw_plot(rows: list[dict[str, Any]], gpu: dict[str, Any], path: Path) -> None:
    """Stacked bars, one per profile, of one GPU's memory (memory_segments), into ``path`` (PNG)."""
    if path.suffix.lower() != ".png":
        raise BadInput(f"--plot {path} must name a .png file (e.g. --plot plan.png).")
    if not path.parent.is_dir():
        raise BadInput(f"--plot {path}: the directory {path.parent} does not exist; create it or name another.")
    try:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
    except ImportError:
        raise BadInput("--plot needs matplotlib on the controller (pip install matplotlib).") from None
    drawn = [row for row in rows if row["verdict"] != "invalid"]
    if not drawn:
        raise BadInput("--plot: no planned layout is valid, so there is no memory to draw.")
    weight_labels = sorted(
        {label for row in drawn for label, _ in memory_segments(row, gpu) if label.startswith("weights")}
    )
    palette = ["#1f77b4", "#aec7e8", "#9467bd", "#c5b0d5", "#8c564b", "#c49c94", "#e377c2", "#17becf", "#bcbd22",
               "#393b79", "#f7b6d2", "#637939", "#9edae5", "#843c39"]
    colours = {label: palette[i % len(palette)] for i, label in enumerate(weight_labels)} | PLOT_COLOURS
    fig = Figure(figsize=(max(6.0, 1.1 * len(drawn) + 3.5), 6.0))
    ax = fig.add_subplot()
    seen: set[str] = set()
    for x, row in enumerate(drawn):
        bottom = 0.0
        for label, value in memory_segments(row, gpu):
            if value <= 0:
                continue
            ax.bar(
                x, value, bottom=bottom, color=colours[label], edgecolor="#404040", linewidth=0.4,
                label=None if label in seen else label,
            )
            seen.add(label)
            bottom += value
        ax.text(x, bottom + 0.5, f"{row['kv_tokens']:,} tok\n{row['verdict']}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(drawn)), [row["profile"] for row in drawn])
    ax.set_ylabel("GiB per GPU")
    ax.set_title(f"One GPU's memory per profile: {describe_gpu(gpu)}", fontsize=9)
    handles, labels = ax.get_legend_handles_labels()
    order = [labels.index(lab) for lab in [*weight_labels, *PLOT_COLOURS] if lab in labels]
    ax.legend([handles[i] for i in order], [labels[i] for i in order], fontsize=7, loc="center left",
              bbox_to_anchor=(1.0, 0.5))
    ax.set_ylim(0, max(sum(v for _, v in memory_segments(r, gpu)) for r in drawn) * 1.12)
    fig.tight_layout()
    try:
        fig.savefig(path, dpi=110)
    except OSError as exc:
        raise BadInput(f"--plot {path} cannot be written: {exc.strerror}.") from None
