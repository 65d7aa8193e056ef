"""Where a secret lies on a host: every file and every process's environment and command line that holds it.

For the check that no worker holds the gateways' admin key (docs/healing.md, "No gateway key on the workers"):

    hits = key_hits(lambda argv, stdin: podman_exec(host, argv, stdin), ADMIN_KEY)

`run(argv, stdin) -> stdout` runs a command on the host (as root: `podman exec -i HOST ...`, ssh) and returns its
output. The key goes to the host's grep on its standard input (`grep -f /dev/stdin`), never in an argv or an
environment, so the search does not find itself. Searched: every file under `root` but the top-level `proc`, `sys` and
`dev` (binary files too; devices, FIFOs and sockets skipped), then every process's /proc/PID/environ and
/proc/PID/cmdline. Returns the paths that hold the key, sorted; /proc entries as "/proc/PID/environ (COMM)".
"""

from __future__ import annotations

from collections.abc import Callable

# sh: the search's own pid is sh's, exec'd into grep, whose command line holds no key; `|| true`: none found is rc 1.
SCRIPT = r"""
cd "$1" || exit 2
set --
for entry in .* *; do
  case "$entry" in .|..|proc|sys|dev) continue ;; esac
  [ -e "$entry" ] || [ -L "$entry" ] && set -- "$@" "$entry"
done
for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do set -- "$@" "$f"; done
exec grep -rlsaF -D skip -f /dev/stdin -- "$@"
"""


def key_hits(run: Callable[[list[str], str], str], key: str, root: str = "/") -> list[str]:
    if len(key) < 8:
        raise ValueError("a key this short would match by chance")
    out = run(["sh", "-c", SCRIPT, "key_search", root], key + "\n")
    hits = []
    for line in out.splitlines():
        if not line:
            continue
        if line.startswith("/proc/"):
            pid = line.split("/")[2]
            comm = run(["sh", "-c", 'cat "/proc/$1/comm" 2>/dev/null || true', "comm", pid], "").strip()
            hits.append(f"{line} ({comm or 'gone'})")
        else:
            hits.append(root.rstrip("/") + "/" + line.removeprefix("./"))
    return sorted(hits)
