"""Profile catalog logic: merge, validate, resolve, render to SGLang arguments, follow fallbacks.

Pure functions over data (the parsed catalog YAML, the parsed JSON Schema, operator additions); no I/O.
Every failure is a ProfileError whose message is a sentence for the operator, never a traceback.

A catalog is ``{"schema_version": 1, "nccl_sets": {name: {...}}, "profiles": {name: profile}}``; a profile
is ``{"description", "flags", "gpus", "nccl", "fallback"}`` with ``flags`` in SGLang's flag names without
dashes (``tp_size: 8``).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

try:  # as moefleet.logic.profiles (CLI) or ansible.module_utils.profiles (modules)
    from . import planner
except ImportError:  # as a bare module: the filter plugin puts module_utils on sys.path
    import planner  # type: ignore[no-redef]


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
    if "profiles" in extra or "nccl_sets" in extra:
        extra_profiles = extra.get("profiles") or {}
        extra_sets = extra.get("nccl_sets") or {}
    else:
        extra_profiles, extra_sets = extra, {}
    for key, addition in (("profiles", extra_profiles), ("nccl_sets", extra_sets)):
        if not isinstance(addition, Mapping):
            raise ProfileError(f"Extra {key} must be a mapping of name to definition.")
        base = merged.get(key)
        merged[key] = {**(base if isinstance(base, Mapping) else {}), **copy.deepcopy(dict(addition))}
    return merged


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


def validate_catalog(catalog: Any, schema: Mapping[str, Any] | None = None) -> None:
    """Raise ProfileError listing every problem (schema first, then cross-references), one per line."""
    problems = schema_errors(catalog, schema) if schema is not None else []
    if not problems and isinstance(catalog, Mapping):
        problems = catalog_problems(catalog)
    elif not isinstance(catalog, Mapping):
        problems = problems or ["(top level): the catalog must be a mapping."]
    if problems:
        raise ProfileError("The profile catalog is not valid:\n" + "\n".join(problems))


def sglang_args(profile: Mapping[str, Any]) -> list[str]:
    """The profile's flags as SGLang arguments, in the profile's order: ``["--tp-size", "8", ...]``.

    ``true`` becomes a bare switch, ``false`` and null leave the flag out.
    """
    flags = profile.get("flags")
    if not isinstance(flags, Mapping):
        raise ProfileError("A profile's flags must be a mapping of SGLang flag names to values.")
    args: list[str] = []
    for key, value in flags.items():
        flag = "--" + str(key).replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            args.append(flag)
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
