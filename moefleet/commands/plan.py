"""moefleet plan: what each profile (or an ad-hoc layout) puts on every GPU, and whether it fits."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from ansible_collections.moefleet.serving.plugins.module_utils import planner, profiles

from moefleet import collection
from moefleet.commands import number_problem, whole_number_problem

DEFAULT_CATALOG = collection.CATALOG
DEFAULT_SCHEMA = collection.SCHEMA

EXIT_OK, EXIT_DOES_NOT_FIT, EXIT_BAD_INPUT = 0, 1, 2
LAYOUT = ("tp", "ep", "pp", "dp")  # the ad-hoc layout's options, each SGLang's --<name>-size


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
    parser.add_argument("--gpus", required=True, type=int, metavar="N", help="GPUs on the host")
    parser.add_argument(
        "--gpu-memory-gib",
        required=True,
        type=float,
        metavar="X",
        help="memory per GPU as PyTorch reports it (94.97 for an RTX PRO 6000)",
    )
    parser.add_argument(
        "--gpu-memory-total-mib",
        type=float,
        metavar="MIB",
        help="nvidia-smi's memory.total per GPU (97887 for an RTX PRO 6000), which SGLang sizes its default "
        "--mem-fraction-static from; default: --gpu-memory-gib in MiB",
    )
    parser.add_argument(
        "--profile", action="append", default=[], metavar="NAME", help="plan only this profile (repeatable)"
    )
    layout = parser.add_argument_group("ad-hoc layout (SGLang flags)")
    layout.add_argument("--tp", type=int, metavar="N", help="--tp-size")
    layout.add_argument("--ep", type=int, metavar="N", help="--ep-size")
    layout.add_argument("--pp", type=int, metavar="N", help="--pp-size")
    layout.add_argument("--dp", type=int, metavar="N", help="--dp-size")
    layout.add_argument("--dp-attention", action="store_true", help="--enable-dp-attention")
    parser.add_argument(
        "--catalog", type=Path, default=DEFAULT_CATALOG, metavar="FILE", help="profile catalog"
    )
    parser.add_argument(
        "--extra-profiles", type=Path, metavar="FILE", help="operator profiles (YAML) laid over the catalog"
    )
    parser.add_argument("--json", action="store_true", help="print a JSON list instead of a table")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        rows = plan_rows(args)
    except (BadInput, planner.PlanError, profiles.ProfileError) as exc:
        print(f"moefleet plan: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(json.dumps(rows, indent=2) if args.json else render_table(rows, args.gpus, args.gpu_memory_gib))
    return EXIT_OK if all(row["verdict"] in ("fits", "tight") for row in rows) else EXIT_DOES_NOT_FIT


def plan_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    low, high = profiles.GPU_COUNT_BOUNDS
    problems = [
        whole_number_problem("--gpus", args.gpus, low, high),
        number_problem("--gpu-memory-gib", args.gpu_memory_gib, 4096, "94.97"),
        number_problem("--gpu-memory-total-mib", args.gpu_memory_total_mib, 4096 * 1024, "97887"),
        *(whole_number_problem(f"--{k}", getattr(args, k), *profiles.FLAG_BOUNDS[f"{k}_size"]) for k in LAYOUT),
    ]
    problem = next((p for p in problems if p), None)
    if problem:
        raise BadInput(problem)
    if args.gpu_memory_total_mib is not None and args.gpu_memory_total_mib < args.gpu_memory_gib * 1024:
        raise BadInput(
            "--gpu-memory-total-mib is nvidia-smi's memory.total, at least --gpu-memory-gib x 1024 "
            "(97887 for an RTX PRO 6000 whose PyTorch capacity is 94.97 GiB)."
        )
    config = _read_json(args.model_config, "model config")
    catalog = load_catalog(args.catalog, args.extra_profiles)
    adhoc = any(v is not None for v in (args.tp, args.ep, args.pp, args.dp)) or args.dp_attention
    if adhoc:
        if args.profile:
            raise BadInput("Give either --profile or an ad-hoc layout (--tp/--ep/--pp/--dp), not both.")
        flags: dict[str, Any] = {"tp_size": args.tp or 1}
        for key, value in (("ep_size", args.ep), ("pp_size", args.pp), ("dp_size", args.dp)):
            if value is not None:
                flags[key] = value
        if args.dp_attention:
            flags["enable_dp_attention"] = True
        layouts = [("ad-hoc", flags)]
    else:
        names = args.profile or profiles.profile_names(catalog)
        layouts = [(name, profiles.resolve_profile(catalog, name)["flags"]) for name in names]
    rows = []
    for name, result in planner.plan_many(
        config, args.gpus, args.gpu_memory_gib, layouts, catalog["profiles"], args.gpu_memory_total_mib
    ):
        row = {"profile": name, **result.to_dict()}
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


def render_table(rows: list[dict[str, Any]], gpus: int, gpu_memory_gib: float) -> str:
    header = ("profile", "flags", "gpus", "weights/GPU", "mem fraction", "KV tokens", "verdict")
    body = [
        (
            row["profile"],
            planner.Layout.from_flags(row["flags"]).cli(),
            f"{row['gpus_used']}/{gpus}",
            f"{row['weights_gib_per_gpu']:.1f} GiB" if row["weights_gib_per_gpu"] else "-",
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

    lines = [f"{gpus} GPUs x {gpu_memory_gib:g} GiB", fmt(header), fmt(tuple("-" * w for w in widths))]
    lines += [fmt(line) for line in body]
    lines.append("")
    lines += [f"{row['profile']}: {row['reason']}" for row in rows]
    return "\n".join(lines)
