"""One home for the fleet's shared settings (issue 34): what more than one role or playbook reads (ports, addresses,
the served model, paths, keys' names) is declared once, in roles/moefleet_defaults/defaults/main.yml, and no role or
playbook reads another role's defaults file by path (include_vars of roles/OTHER/defaults, a lookup('file') of one,
or "{{ role_path }}/../OTHER/"). Each shared variable keeps its owner's name and is documented by its owner's
meta/argument_specs.yml (the home's "# roles/OWNER" section says which); it belongs in the home when a role or playbook
besides its owner reads it (the owner's spec counts as the owner's read: Ansible checks the variable there when the role
starts). Every role that reads one depends on the home, and every play that reads one itself (its vars, tasks, the task
files it imports) lists it first. A read is a Jinja expression naming the variable: in a template, in a YAML string
holding {{ or {%, or in a condition (when, that, failed_when, ...); comments, task names and plain strings are none."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest
import yaml
from role_defaults import HOME, HOME_FILE, home, own

ROOT = Path(__file__).resolve().parents[2]
ROLES = sorted(p.name for p in (ROOT / "roles").iterdir() if (p / "meta" / "main.yml").exists())
# Where a role reads variables (its defaults and argument specs declare them; its README documents them).
ROLE_CODE = ("tasks", "vars", "handlers", "templates", "files")
# Keys whose string values Ansible templates as bare expressions.
CONDITIONS = {"when", "that", "failed_when", "changed_when", "until"}
# A read of another role's defaults by path: roles/X/defaults, '/defaults/' in a path, {{ role_path }}/../X (another
# role's directory; "{{ role_path }}/../../plugins" is the collection's own code, allowed).
BY_PATH = [
    re.compile(r"/defaults/"),
    re.compile(r"roles/[\w{}' ~]*/defaults\b"),
    re.compile(r"role_path\s*}}\s*/\.\./(?!\.\./)"),
]


def code(text: str) -> str:
    """The text without its comment lines (YAML and Jinja comments of one line)."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def role_files(role: str) -> list[Path]:
    return sorted(p for top in ROLE_CODE for p in (ROOT / "roles" / role / top).rglob("*") if p.is_file())


def playbook_files() -> list[Path]:
    return sorted([ROOT / "deploy.yml", *(ROOT / "playbooks").rglob("*.yml")])


def by_path(text: str) -> list[str]:
    return [m.group(0) for pattern in BY_PATH for m in pattern.finditer(code(text))]


def test_no_role_or_playbook_reads_another_roles_defaults_by_path():
    readers = [*playbook_files(), *(p for role in ROLES for p in role_files(role)),
               *(ROOT / "roles").glob("*/meta/main.yml"), *(ROOT / "plugins").rglob("*.py")]
    found = [f"{path.relative_to(ROOT)}: {hit}" for path in readers
             if path.suffix in {".yml", ".yaml", ".j2", ".py", ""} for hit in by_path(path.read_text(errors="replace"))]
    assert found == [], ("read the variable itself (declared once in roles/moefleet_defaults, which the role depends "
                         "on and the play lists first):\n" + "\n".join(found))


@pytest.mark.parametrize(
    ("text", "hits"),
    [
        ('file: "{{ role_path }}/../sglang_service/defaults/main.yml"', 2),
        ("{{ lookup('ansible.builtin.file', playbook_dir ~ '/../roles/nvidia_driver/defaults/main.yml') | from_yaml }}",
         2),
        ("{{ (lookup('ansible.builtin.file', '../roles/node_metrics/defaults/main.yml') | from_yaml).x }}", 2),
        ('file: "{{ playbook_dir }}/../roles/{{ item }}/defaults/main.yml"', 2),
        ('src: "{{ role_path }}/../fault_watch/files/x"', 1),
        ('src: "{{ role_path }}/../../plugins/module_utils/host_faults.py"', 0),
        ("# the owner's roles/sglang/defaults/main.yml says why", 0),
        ("{{ sglang_service_port }}", 0),
    ],
)
def test_it_sees_a_read_by_path(text, hits):
    assert len(by_path(text)) == hits


def owners() -> dict[str, str]:
    """Each shared variable's owner: the role named by the "# roles/OWNER" line that opens its section."""
    out, owner = {}, None
    for line in HOME_FILE.read_text().splitlines():
        if m := re.match(r"^# roles/([a-z_]+)$", line):
            owner = m.group(1)
        elif m := re.match(r"^([a-z_][a-z0-9_]*):", line):
            out[m.group(1)] = owner
    return out


def spec_options(role: str) -> dict:
    path = ROOT / "roles" / role / "meta" / "argument_specs.yml"
    if not path.exists():
        return {}
    return yaml.safe_load(path.read_text())["argument_specs"]["main"].get("options") or {}


def expressions(node, key: str | None = None) -> list[str]:
    """The Jinja a parsed YAML document holds: strings with {{ or {%, and the values of condition keys."""
    if isinstance(node, list):
        return [e for item in node for e in expressions(item, key)]
    if isinstance(node, dict):
        return [e for k, v in node.items() for e in expressions(v, k)]
    if isinstance(node, str) and ("{{" in node or "{%" in node or key in CONDITIONS):
        return [node]
    return []


@cache
def read_text(path: Path) -> str:
    """What ``path`` reads: a YAML file's expressions, a template's text without its comments, a file's nothing."""
    if path.suffix in {".yml", ".yaml"}:
        return "\n".join(expressions(yaml.safe_load(path.read_text())))
    if path.suffix == ".j2":
        return re.sub(r"{#.*?#}", "", path.read_text(), flags=re.S)
    return ""


def reads(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w.'\"]){re.escape(name)}(?![\w'\"])", text) is not None


@cache
def readers(name: str) -> frozenset[str]:
    """The roles (roles/NAME) and playbook files that read ``name``, the home itself left out; a shared variable
    whose default is a template of ``name`` (cuda_toolkit_package of cuda_toolkit_version) lends it its readers."""
    found = {f"roles/{role}" for role in ROLES if role != HOME
             for path in role_files(role) if reads(read_text(path), name)}
    found |= {str(path.relative_to(ROOT)) for path in playbook_files() if reads(read_text(path), name)}
    for other, value in home().items():
        if other != name and isinstance(value, str) and reads(value, name):
            found |= readers(other)
    return frozenset(found)


def test_the_home_holds_only_defaults():
    assert sorted(p.name for p in (ROOT / "roles" / HOME).iterdir()) == ["README.md", "defaults", "meta"]
    assert (yaml.safe_load((ROOT / "roles" / HOME / "meta" / "main.yml").read_text()) or {}).get("dependencies") == []


@pytest.mark.parametrize("name", sorted(home()))
def test_each_shared_variable_is_read_beside_its_owner(name):
    owner = f"roles/{owners()[name]}"
    others = readers(name) - {owner}
    assert others, (f"{name} is read by {owner} only: move it back to {owner}/defaults/main.yml, where what one role "
                    "alone reads belongs")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("{{ hostvars[h].sglang_service_port | default(sglang_service_port) }}", True),
        ("_running != sglang_router_worker_api_key", True),
        ("{{ hv.sglang_service_port }}", False),  # another host's, not this play's
        ("{{ item == 'sglang_service_port' }}", False),  # a name in a string
        ("{{ sglang_service_port_x }}", False),
    ],
)
def test_it_sees_a_read(text, expected):
    assert reads(text, "sglang_service_port" if "port" in text else "sglang_router_worker_api_key") is expected


@pytest.mark.parametrize("name", sorted(home()))
def test_each_shared_variable_is_declared_once_and_documented_by_its_owner(name):
    owner = owners()[name]
    assert owner in ROLES and owner != HOME, f"{name}: its section names no role (# roles/OWNER)"
    assert name in spec_options(owner), f"{name}: declare it in roles/{owner}/meta/argument_specs.yml"
    if "default" in spec_options(owner)[name]:
        assert spec_options(owner)[name]["default"] == home()[name], f"{name}: the spec's default is not the home's"
    also = [role for role in ROLES if name in own(role) and role != HOME]
    assert also == [], f"{name} is declared in roles/{HOME} and again in {also}"


def test_every_role_that_reads_a_shared_variable_depends_on_the_home():
    names = set(home())
    missing = []
    for role in ROLES:
        if role == HOME:
            continue
        text = "\n".join(read_text(p) for p in role_files(role))
        read = sorted(n for n in names if reads(text, n))
        deps = (yaml.safe_load((ROOT / "roles" / role / "meta" / "main.yml").read_text()) or {}).get("dependencies")
        if read and {"role": HOME} not in (deps or []):
            missing.append(f"{role} (reads {', '.join(read[:3])}...)")
    assert missing == [], "add '- role: moefleet_defaults' to their meta/main.yml dependencies: " + ", ".join(missing)


def _imported_task_files(node, base: Path) -> list[Path]:
    found = []
    if isinstance(node, list):
        for item in node:
            found += _imported_task_files(item, base)
    elif isinstance(node, dict):
        for key, value in node.items():
            if key in {"ansible.builtin.import_tasks", "ansible.builtin.include_tasks"} and isinstance(value, str):
                found.append(base / value)
            else:
                found += _imported_task_files(value, base)
    return found


def plays():
    for path in playbook_files():
        for play in yaml.safe_load(path.read_text()) or []:
            if "hosts" in play:
                yield path, play


@pytest.mark.parametrize(("path", "play"), list(plays()),
                         ids=[f"{p.relative_to(ROOT)}:{play['name']}" for p, play in plays()])
def test_every_play_that_reads_a_shared_variable_lists_the_home_first(path, play):
    own_content = {k: v for k, v in play.items() if k != "roles"}
    texts = expressions(own_content) + [read_text(f) for f in _imported_task_files(own_content, path.parent)]
    text = "\n".join(texts)
    read = sorted(n for n in home() if reads(text, n))
    if not read:
        return
    first = (play.get("roles") or [None])[0]
    assert first in ({"role": HOME}, HOME), (
        f"{path.relative_to(ROOT)} play {play['name']!r} reads {', '.join(read[:4])}: list '- role: {HOME}' first "
        "in its roles (a host's hostvars and a play without it hold no role's defaults)")
