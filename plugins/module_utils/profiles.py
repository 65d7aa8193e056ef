"""Profile catalog logic: merge, validate, resolve, render to SGLang arguments, follow fallbacks.

Pure functions over data (the parsed catalog YAML, the parsed JSON Schema, operator additions); no I/O.
Every failure is a ProfileError whose message is a sentence for the operator, never a traceback.

A catalog is ``{"schema_version": 1, "nccl_sets": {name: {...}}, "profiles": {name: profile}}``; a profile
is ``{"description", "flags", "gpus", "nccl", "fallback"}`` with ``flags`` in SGLang's flag names without
dashes (``tp_size: 8``).
"""

from __future__ import annotations

import copy
import json
import math
import posixpath
import re
from collections.abc import Mapping
from typing import Any

from ansible_collections.moefleet.serving.plugins.module_utils import (
    planner,
    playbook_inputs,
    serving_model,
    sglang_releases,
)
from ansible_collections.moefleet.serving.plugins.module_utils.extra_flags import (
    FLAG_BOUNDS,
    OTHER_INT_BOUNDS,
    extra_flag_problems,
    value_problem,
)


class ProfileError(ValueError):
    """A catalog or profile problem; the message is the sentence to show."""


def merge_catalog(shipped: Mapping[str, Any], extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The shipped catalog with operator additions laid over it.

    ``extra`` is either a catalog-shaped mapping (``profiles`` and/or ``nccl_sets``) or a bare mapping
    of profile name to profile. A profile or NCCL set of the same name replaces the shipped one whole.
    """
    if not isinstance(shipped, Mapping):
        raise ProfileError(
            "The profile catalog must be a mapping with schema_version, nccl_sets and profiles."
        )
    merged = copy.deepcopy(dict(shipped))
    if not extra:
        return merged
    if not isinstance(extra, Mapping):
        raise ProfileError(
            "Extra profiles must be a mapping of profile name to profile, not "
            f"{type(extra).__name__}; pass them as YAML in inventory or as JSON with -e '{{...}}'."
        )
    extra_profiles, extra_sets = extra_parts(extra)
    for key, addition in (("profiles", extra_profiles), ("nccl_sets", extra_sets)):
        if not isinstance(addition, Mapping):
            raise ProfileError(f"Extra {key} must be a mapping of name to definition.")
        base = merged.get(key)
        merged[key] = {**(base if isinstance(base, Mapping) else {}), **copy.deepcopy(dict(addition))}
    return merged


def extra_parts(extra: Mapping[str, Any]) -> tuple[Any, Any]:
    """Operator additions as ``(profiles, nccl_sets)``: catalog-shaped, or a bare mapping of profiles."""
    if "profiles" in extra or "nccl_sets" in extra:
        return extra.get("profiles") or {}, extra.get("nccl_sets") or {}
    return extra, {}


def profile_names(catalog: Mapping[str, Any]) -> list[str]:
    """Profile names in catalog order."""
    profiles = catalog.get("profiles")
    return list(profiles) if isinstance(profiles, Mapping) else []


def resolve_profile(catalog: Mapping[str, Any], name: Any) -> dict[str, Any]:
    """The profile called ``name``; an unknown or mistyped name raises with the list of valid names."""
    names = profile_names(catalog)
    if not isinstance(name, str) or not name:
        raise ProfileError(
            f"The profile must be a name such as {names[0] if names else 'tp8'}, not {name!r}; "
            f"valid profiles: {', '.join(names)}."
        )
    if name not in names:
        raise ProfileError(f"Unknown profile {name!r}; valid profiles: {', '.join(names)}.")
    return dict(catalog["profiles"][name])


def schema_errors(document: Any, schema: Mapping[str, Any]) -> list[str]:
    """Validate ``document`` against a JSON Schema; each error as ``path: message``, sorted by path."""
    try:
        import jsonschema  # lazily: only validation needs it
    except ImportError:
        raise ProfileError(
            "Validating the catalog needs the Python package jsonschema on the controller; "
            "install the moefleet requirements (pip install jsonschema)."
        ) from None
    validator_cls = jsonschema.validators.validator_for(schema)
    validator = validator_cls(schema)
    errors = []
    for error in validator.iter_errors(document):
        path = "/".join(str(part) for part in error.absolute_path) or "(top level)"
        errors.append(f"{path}: {_short(error)}")
    return sorted(errors)


def _short(error: Any) -> str:
    """jsonschema's message, without the dump of a whole sub-document it sometimes starts with."""
    if error.validator == "additionalProperties":
        return error.message
    if error.validator in ("required", "enum", "const", "pattern", "type", "minimum", "maximum"):
        return error.message
    if error.validator in ("oneOf", "anyOf"):
        return "is neither a profile name nor null" if error.instance is not None else error.message
    text = str(error.message)
    return text if len(text) < 160 else text[:157] + "..."


def flag_problems(name: str, profile: Mapping[str, Any]) -> list[str]:
    """SGLang's flag invariants for one profile, plus its declared GPU count, as sentences."""
    flags = profile.get("flags")
    if not isinstance(flags, Mapping):
        return [f"profiles/{name}/flags: must be a mapping of SGLang flags."]
    bounds = flag_value_problems(f"profiles/{name}/flags", flags)
    if bounds:
        return bounds
    try:
        layout = planner.Layout.from_flags(flags)
    except (TypeError, ValueError) as exc:
        return [f"profiles/{name}/flags: a size is not a whole number ({exc})."]
    problems = [f"profiles/{name}/flags: {p}" for p in planner.layout_problems(layout)]
    gpus = profile.get("gpus")
    if not problems and isinstance(gpus, int) and gpus != layout.gpus_used:
        problems.append(
            f"profiles/{name}/gpus: says {gpus} but {layout.cli()} starts {layout.gpus_used} GPUs "
            "(tp x pp, times dp only without DP attention)."
        )
    return problems


def catalog_problems(catalog: Mapping[str, Any]) -> list[str]:
    """Cross-references the schema cannot check: flag invariants, NCCL set names, fallback ladders."""
    problems: list[str] = []
    profiles = catalog.get("profiles") or {}
    sets = catalog.get("nccl_sets") or {}
    for key, names in (("nccl_sets", sets), ("profiles", profiles)):
        problems.extend(p for p in (name_problem(key, name) for name in names) if p)
    if problems:
        return problems
    for name, profile in profiles.items():
        if not isinstance(profile, Mapping):
            continue
        problems.extend(flag_problems(name, profile))
        if profile.get("nccl") not in sets:
            problems.append(
                f"profiles/{name}/nccl: {profile.get('nccl')!r} is not an NCCL set; "
                f"known sets: {', '.join(sets)}."
            )
        fallback = profile.get("fallback")
        if fallback is not None and fallback not in profiles:
            problems.append(f"profiles/{name}/fallback: {fallback!r} is not a profile in the catalog.")
    if not problems:
        for name in profiles:
            try:
                fallback_ladder(catalog, name)
            except ProfileError as exc:
                problems.append(f"profiles/{name}/fallback: {exc}")
    return problems


def validate_catalog(
    catalog: Any, schema: Mapping[str, Any] | None = None, origins: Mapping[str, str] | None = None
) -> None:
    """Raise ProfileError listing every problem (schema first, then cross-references), one per line.

    ``origins`` maps catalog paths (``profiles/tp8/flags``) to where they were written (``FILE, line N``);
    each problem starts with the nearest one (see catalog_origins).
    """
    problems = schema_errors(catalog, schema) if schema is not None else []
    if not problems and isinstance(catalog, Mapping):
        problems = catalog_problems(catalog)
    elif not isinstance(catalog, Mapping):
        problems = problems or ["(top level): the catalog must be a mapping."]
    if problems:
        located = [_located(problem, origins or {}) for problem in problems]
        raise ProfileError("The profile catalog is not valid:\n" + "\n".join(located))


def _located(problem: str, origins: Mapping[str, str]) -> str:
    """``FILE, line N: path: message`` for the longest prefix of the problem's path (at least the profile
    or NCCL set, never just ``profiles``) that has an origin."""
    path = problem.split(": ", 1)[0]
    parts = path.split("/")
    printable = {_printable(key): where for key, where in origins.items()}
    for end in range(len(parts), min(2, len(parts)) - 1, -1):
        where = printable.get("/".join(parts[:end]))
        if where:
            return f"{where}: {problem}"
    return problem


def _printable(text: str) -> str:
    """``text`` with control characters escaped (a name's trailing newline shows as ``\\n``)."""
    return text.encode("unicode_escape").decode("ascii")


def sglang_args(profile: Mapping[str, Any], release: str) -> list[str]:
    """The profile's flags as SGLang ``release``'s arguments, in the profile's order: ``["--tp-size", "8", ...]``.

    ``true`` becomes a bare switch, ``false`` and null leave the flag out, a list gives the flag its values in
    turn (``--cuda-graph-bs 1 2 4``), a mapping is written as JSON (``--json-model-override-args``). A flag the
    release renamed is written under its name there (sglang_releases.RENAMED: ``cuda_graph_max_bs`` is
    ``--cuda-graph-max-bs-decode`` on 0.5.23).
    """
    flags = profile.get("flags")
    if not isinstance(flags, Mapping):
        raise ProfileError("A profile's flags must be a mapping of SGLang flag names to values.")
    if release not in sglang_releases.RENAMED:
        raise ProfileError(sglang_releases.release_problem(f"sglang=={release}"))
    args: list[str] = []
    for key, value in sglang_releases.spelled_for(flags, release).items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
        elif isinstance(value, list | tuple):
            args.extend([flag, *(str(v) for v in value)])
        elif isinstance(value, Mapping):
            args.extend([flag, json.dumps(value, separators=(",", ":"))])
        else:
            args.extend([flag, str(value)])
    return args


def fallback_ladder(catalog: Mapping[str, Any], name: str) -> list[str]:
    """``name`` followed by each fallback in turn until a profile whose fallback is null."""
    resolve_profile(catalog, name)
    ladder = [name]
    profiles = catalog["profiles"]
    while True:
        nxt = profiles[ladder[-1]].get("fallback")
        if nxt is None:
            return ladder
        if nxt not in profiles:
            raise ProfileError(f"{ladder[-1]} falls back to {nxt!r}, which is not a profile in the catalog.")
        if nxt in ladder:
            raise ProfileError(
                "The fallback ladder loops: " + " -> ".join([*ladder, nxt]) + "; end it with fallback: null."
            )
        ladder.append(nxt)


def extra_var_problem(name: str, value: Any, expected: type | tuple[type, ...]) -> str | None:
    """A sentence telling how to pass an ``-e`` value of the wrong type, or None when it is fine.

    ``-e key=value`` always gives strings; numbers, booleans and mappings need JSON: ``-e '{"key": 8}'``.
    """
    if isinstance(value, expected) and not (isinstance(value, bool) and bool not in _as_tuple(expected)):
        return None
    wanted = " or ".join(_TYPE_WORDS.get(t, t.__name__) for t in _as_tuple(expected))
    example = _TYPE_EXAMPLES.get(_as_tuple(expected)[0], '"..."')
    return (
        f"{name} must be {wanted}, not {type(value).__name__} {value!r}; -e {name}=... always passes "
        f"a string, so pass it as JSON: -e '{{\"{name}\": {example}}}'."
    )


_TYPE_WORDS = {
    int: "a whole number",
    float: "a number",
    bool: "true or false",
    dict: "a mapping",
    str: "text",
}
_TYPE_EXAMPLES = {int: "8", float: "0.85", bool: "true", dict: '{"name": {...}}', str: '"tp8"'}


def _as_tuple(expected: type | tuple[type, ...]) -> tuple[type, ...]:
    return expected if isinstance(expected, tuple) else (expected,)


# ---------------------------------------------------------------------------------------------------
# Controller checks of what operators type: names, numbers, each host's inputs
# ---------------------------------------------------------------------------------------------------

# fullmatch, not the schema's "$", which in Python also matches before a trailing newline.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,39}")


def name_problem(key: str, name: Any) -> str | None:
    """A sentence when ``name``, a profile or NCCL set name under ``key``, is not a safe name, else None."""
    if isinstance(name, str) and NAME_PATTERN.fullmatch(name):
        return None
    return (
        f"{key}/{_printable(str(name))}: {name!r} is not a usable name; rename it to 1 to 40 lower-case letters, "
        "digits, '_' or '-', starting with a letter (it ends up in the unit's Description= and file names)."
    )


def flag_value_problems(path: str, flags: Mapping[str, Any]) -> list[str]:
    """Numbers in a flag mapping that SGLang cannot take: out-of-bounds or fractional whole-number flags,
    non-finite fractions. One sentence each, starting with ``path/flag``."""
    problems: list[str] = []
    for key, value in flags.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        low, high = FLAG_BOUNDS.get(str(key), OTHER_INT_BOUNDS)
        if isinstance(value, float) and not math.isfinite(value):
            problems.append(f"{path}/{key}: {value} is not a number SGLang can take; give a finite value.")
        elif isinstance(value, float) and (str(key) in FLAG_BOUNDS or value.is_integer()):
            problems.append(f"{path}/{key}: write a whole number from {low} to {high}, not {value!r}.")
        elif isinstance(value, int) and not low <= value <= high:
            problems.append(f"{path}/{key}: {value} is out of range; give a whole number from {low} to {high}.")
    return problems


# One reader of a whole number for every controller check (module_utils/playbook_inputs.py).
whole_number = playbook_inputs.whole_number


HF_REPO = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
HF_COMMIT = re.compile(r"[0-9a-f]{40}")
MODEL_SOURCES = ("huggingface", "prestaged")


def model_source_problems(host: str, inputs: Mapping[str, Any]) -> list[str]:
    """The rules between the sglang_model role's inputs for one host that its argument spec cannot state, as
    sentences: an absolute path, and for huggingface a repo, a 40-hex commit and, for a gated model, a token
    (``sglang_model_hf_token_set``). The source's choices, like every type, are the spec's to check."""
    source = inputs.get("sglang_model_source", "huggingface")
    path = inputs.get("sglang_model_path")
    problems: list[str] = []
    if source not in MODEL_SOURCES:
        return []  # the role's argument spec (choices) refuses it, naming the two (playbooks/validate.yml, play 2)
    if not isinstance(path, str) or not path.startswith("/") or posixpath.normpath(path) != path.rstrip("/"):
        what = "the copy already on the host" if source == "prestaged" else "the download's target directory"
        problems.append(f"sglang_model_path is {path!r} for {host}; set it to the absolute path of {what}.")
    if source == "prestaged":
        return problems
    repo = inputs.get("sglang_model_repo")
    if not isinstance(repo, str) or not HF_REPO.fullmatch(repo):
        problems.append(
            f"sglang_model_repo is {repo!r} for {host}; set it to the Hugging Face repository as owner/name "
            "(e.g. moonshotai/Kimi-K2.6)."
        )
    revision = inputs.get("sglang_model_revision")
    if not isinstance(revision, str) or not HF_COMMIT.fullmatch(revision):
        problems.append(
            f"sglang_model_revision is {revision!r} for {host}; set it to the 40-hex commit hash of "
            f"{repo} to serve (a branch or tag would change under you), or set sglang_model_source=prestaged "
            "for a copy already on the host."
        )
    gated = playbook_inputs.confirmed(inputs.get("sglang_model_gated", False))
    if gated and not inputs.get("sglang_model_hf_token_set"):
        problems.append(
            f"{repo} is gated (sglang_model_gated) but sglang_model_hf_token is empty for {host}; put a token "
            "that may read it in vault as sglang_model_hf_token and run with --ask-vault-pass."
        )
    return problems


GPU_COUNT_BOUNDS = (1, 64)


def host_problems(host: str, inputs: Mapping[str, Any], catalog: Mapping[str, Any], profile: str) -> list[str]:
    """The problems of one host's inputs that the roles' argument specs cannot state (a range, a rule between
    variables, the catalog), as sentences naming the variable and the fix; types, booleans and choices are the
    specs' (playbooks/validate.yml checks them with validate_argument_spec).

    ``inputs`` holds the variables the host defines (inventory, -e) over the roles' defaults; ``profile``
    is the resolved profile name. Checked: the GPUs every profile on ``profile``'s fallback ladder starts
    against ``nvidia_driver_expected_gpu_count`` (fewer is allowed only with moefleet_allow_unfit);
    ``sglang_package_spec`` (it pins a release moefleet has the data of: sglang_releases; the host's
    ``cuda_toolkit_version`` and ``nvidia_driver_branch`` run it); with it
    ``sglang_service_extra_flags`` and the served model's parsers (extra_flags: that release's own parser data);
    ``sglang_service_port``'s range; the model source.
    """
    problems: list[str] = []
    gpus, problem = whole_number(
        "nvidia_driver_expected_gpu_count", inputs.get("nvidia_driver_expected_gpu_count", 8), *GPU_COUNT_BOUNDS, host
    )
    if problem:
        problems.append(problem)
    allow_unfit = playbook_inputs.confirmed(inputs.get("moefleet_allow_unfit", False))
    for name in fallback_ladder(catalog, profile) if gpus else ():
        layout = planner.Layout.from_flags(catalog["profiles"][name]["flags"])
        if layout.gpus_used == gpus or (layout.gpus_used < gpus and allow_unfit):
            continue
        which = f"Profile {name}" + (f" (on {profile}'s fallback ladder)" if name != profile else "")
        wanted = planner.suggest_full_host_layout(layout, gpus)
        if layout.gpus_used > gpus:
            fix = f"pick a profile for {gpus} GPUs, or correct nvidia_driver_expected_gpu_count"
        elif wanted is not None:
            fix = f"use {wanted.cli()} to spread it over all {gpus}, or set moefleet_allow_unfit=true to start it"
        else:
            fix = f"use a layout that starts {gpus} GPUs, or set moefleet_allow_unfit=true to start it"
        problems.append(
            f"{which} starts {layout.gpus_used} GPUs ({layout.cli()}) but the inventory declares {gpus} for {host} "
            f"(nvidia_driver_expected_gpu_count): {fix}."
        )
    spec = inputs.get("sglang_package_spec")
    release_problem = sglang_releases.release_problem(spec, host)
    if release_problem:
        problems.append(release_problem)
    else:
        problems.extend(sglang_releases.stack_problems(
            sglang_releases.release_of(spec), inputs.get("cuda_toolkit_version"), inputs.get("nvidia_driver_branch"),
            host))
    extra_flags = inputs.get("sglang_service_extra_flags", {})
    problem = extra_var_problem("sglang_service_extra_flags", extra_flags, dict)
    if problem:
        problems.append(problem)
    elif not release_problem:
        problems.extend(f"{host}: {p}" for p in extra_flag_problems("sglang_service_extra_flags", extra_flags,
                                                                    sglang_releases.release_of(spec)))
    _, problem = whole_number("sglang_service_port", inputs.get("sglang_service_port", 30000), 1, 65535, host)
    if problem:
        problems.append(problem)
    if not release_problem:
        problems.extend(served_model_problems(host, inputs, sglang_releases.release_of(spec)))
    problems.extend(model_source_problems(host, inputs))
    return problems


def served_model_problems(host: str, inputs: Mapping[str, Any], release: str) -> list[str]:
    """The served model's flags (serving_model.model_flags): its entry exists and each value is one SGLang
    ``release`` takes. Judged when the inputs carry the role's table (playbooks/validate.yml passes the
    sglang_service defaults)."""
    if "sglang_service_models" not in inputs:
        return []
    try:
        flags = serving_model.model_flags(
            inputs.get("sglang_service_models") or {}, inputs.get("sglang_service_model", ""),
            inputs.get("sglang_service_tool_call_parser", serving_model.AUTO),
            inputs.get("sglang_service_reasoning_parser", serving_model.AUTO))
    except (serving_model.ServingModelError, TypeError, ValueError) as exc:
        return [f"{host}: {exc}"]
    variable = {"tool_call_parser": "sglang_service_tool_call_parser",
                "reasoning_parser": "sglang_service_reasoning_parser"}
    problems = []
    for flag, value in flags.items():
        problem = value_problem(flag, value, release)
        if problem:
            source = (f"the entry {inputs.get('sglang_service_model')!r} of sglang_service_models"
                      if inputs.get(variable[flag], serving_model.AUTO) == serving_model.AUTO else variable[flag])
            problems.append(f"{host}: {variable[flag]} (from {source}): {problem}")
    return problems


# ---------------------------------------------------------------------------------------------------
# Where catalog entries were written: YAML files with their lines, for messages that name them
# ---------------------------------------------------------------------------------------------------


def load_yaml_lines(text: str, source: str) -> tuple[Any, dict[str, str]]:
    """Parse YAML ``text`` read from ``source``: ``(data, origins)``, origins mapping each path
    (``profiles/tp8/flags``) to ``"SOURCE, line N"``. A syntax error is a ProfileError naming the line."""
    import yaml

    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError(f"{source}{where}: not valid YAML ({problem}); fix the file there.") from None
    origins: dict[str, str] = {}

    def walk(current: Any, path: str) -> None:
        if isinstance(current, yaml.MappingNode):
            for key, value in current.value:
                child = f"{path}/{key.value}" if path else str(key.value)
                origins[child] = f"{source}, line {key.start_mark.line + 1}"
                walk(value, child)
        elif isinstance(current, yaml.SequenceNode):
            for index, value in enumerate(current.value):
                child = f"{path}/{index}" if path else str(index)
                origins[child] = f"{source}, line {value.start_mark.line + 1}"
                walk(value, child)

    walk(node, "")
    return data, origins


def catalog_origins(shipped: Mapping[str, str], extra: Any, extra_origins: Mapping[str, str] | None) -> dict[str, str]:
    """Origins of the merged catalog: the shipped file's, except for profiles and NCCL sets the operator's
    additions replace, whose paths (relative to ``extra``, in either shape merge_catalog takes) point at
    where the operator wrote them."""
    origins = dict(shipped)
    if not isinstance(extra, Mapping) or not extra:
        return origins
    shaped = "profiles" in extra or "nccl_sets" in extra
    replaced = []
    for key, addition in zip(("profiles", "nccl_sets"), extra_parts(extra), strict=True):
        if isinstance(addition, Mapping):
            replaced += [f"{key}/{name}" for name in addition]
    origins = {p: o for p, o in origins.items() if not any(p == r or p.startswith(r + "/") for r in replaced)}
    for path, where in (extra_origins or {}).items():
        origins[path if shaped else f"profiles/{path}"] = where
    return origins
