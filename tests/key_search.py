"""Where a secret lies on a host: every file and every process's environment and command line that holds it.

For the check that no worker holds the gateways' admin key (docs/healing.md, "No gateway key on the workers"):

    hits = key_hits(lambda argv, stdin: podman_exec(host, argv, stdin), ADMIN_KEY)

`run(argv, stdin) -> stdout` runs a command on the host (as root: `podman exec -i HOST ...`, ssh) and returns its
output. The key goes to the host on its standard input, never in an argv or an environment, so the search does not
find itself. Searched: every file under `root` but the top-level `proc`, `sys` and `dev` (binary files too; devices,
FIFOs and sockets skipped; files over MAX_MIB only under var/log), then every process's /proc/PID/environ and
/proc/PID/cmdline. Returns the paths that hold the key, sorted; /proc entries as "/proc/PID/environ (COMM)".
"""

from __future__ import annotations

from collections.abc import Callable

# The key is read from stdin into a root-only file in /tmp (left out of the search, removed at the end), which grep
# reads with -f: it is in no argv and no environment, so the search does not find itself. Files larger than
# MAX_MIB are left out except under var/log (the journal, the services' logs: where a leaked key would be): those
# are model weights (the lab's are sparse, hundreds of GB that grep would read as zeros), wheels and libraries.
# `|| true`: none found is grep's rc 1.
MAX_MIB = 16
SCRIPT = r"""
cd "$1" || exit 2
umask 077
k=$(mktemp /tmp/key_search.XXXXXX) || exit 2
trap 'rm -f "$k"' EXIT
cat > "$k"
find . \( -path ./proc -o -path ./sys -o -path ./dev -o -path ".$k" \) -prune -o -type f \
     \( -size -""" + str(MAX_MIB) + r"""M -o -path './var/log/*' \) -print0 \
  | xargs -0r grep -lsaF -D skip -f "$k" -- || true
grep -lsaF -f "$k" -- /proc/[0-9]*/environ /proc/[0-9]*/cmdline || true
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
