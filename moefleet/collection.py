"""Where the collection moefleet.serving lies, whose catalog, schema and playbooks the CLI uses.

The CLI imports the collection's logic as ``ansible_collections.moefleet.serving.plugins.module_utils.<name>``,
as the collection's modules and filters do, and finds the collection's root from that import, never from the
working directory. In a clone, `make setup` puts ``.ansible/collections`` (where a link names the clone
moefleet.serving) on the venv's Python path; an installed collection is found on Python's path or, failing
that, where ansible-playbook finds collections (ansible.cfg's collections_path, ANSIBLE_COLLECTIONS_PATH,
~/.ansible/collections).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def _module_utils_dir() -> Path:
    """The collection's plugins/module_utils as Python imported it (through the clone's link: not resolved)."""
    try:
        import ansible_collections.moefleet.serving.plugins.module_utils as module_utils
    except ModuleNotFoundError:
        from ansible.plugins.loader import init_plugin_loader

        # Ansible's collection finder, over the collections paths it is configured with; it takes over the
        # ansible_collections package, so the plain namespace package the failed import left goes first.
        for name in [n for n in sys.modules if n == "ansible_collections" or n.startswith("ansible_collections.")]:
            del sys.modules[name]
        init_plugin_loader()
        try:
            import ansible_collections.moefleet.serving.plugins.module_utils as module_utils
        except ModuleNotFoundError:
            print(
                "moefleet: the collection moefleet.serving is not installed: run `make setup` in the clone, or "
                "`ansible-galaxy collection install` its tarball into a collections path Ansible uses.",
                file=sys.stderr,
            )
            raise SystemExit(2) from None  # the commands' exit status for input they cannot use
    return Path(os.path.abspath(module_utils.__file__)).parent


_IMPORTED = _module_utils_dir()
ROOT = _IMPORTED.resolve().parents[1]
# The directory holding ansible_collections/moefleet/serving as Python found it (a clone: its .ansible/collections,
# whose link names the clone; installed: the collections path), for Ansible's collections path.
COLLECTIONS_DIR = _IMPORTED.parents[4]
PLAYBOOKS = ROOT / "playbooks"
CATALOG = ROOT / "profiles" / "catalog.yml"
SCHEMA = ROOT / "schemas" / "profile_catalog.schema.json"
# A clone's own settings (the lab as default inventory, collections_path); an installed collection ships none
# and runs under the operator's.
ANSIBLE_CFG = ROOT / "ansible.cfg" if (ROOT / "ansible.cfg").is_file() else None
