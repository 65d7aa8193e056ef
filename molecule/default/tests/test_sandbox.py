"""From inside the running service's own sandbox (its mount namespace, as its user): what SGLang writes and
opens is allowed, and nothing else on the host is writable.

The lab's hosts run systemd with CAP_SYS_ADMIN, so the unit's mount-namespace options are applied as on a
real host. The GPU nodes are stand-ins on the NVIDIA driver's majors with no driver behind them in the
lab's kernel: an open that gets past the node's mode, the mount and the cgroup ends in ENXIO ("No such
device or address"), which is the lab's "opened".
"""

import json

UNIT = "sglang.service"
HOME = "/var/lib/sglang"

PROBE = r"""
import errno, json, os, sys
out = {}
for path in sys.argv[1:]:
    kind, _, target = path.partition(":")
    try:
        if kind == "write":
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(target, "w") as fh:
                fh.write("probe")
            os.unlink(target)
        elif kind == "mkdir":
            os.mkdir(target)
            os.rmdir(target)
        else:
            os.close(os.open(target, os.O_RDWR))
        out[path] = "ok"
    except OSError as exc:
        out[path] = "ok" if kind == "open" and exc.errno == errno.ENXIO else errno.errorcode[exc.errno]
print(json.dumps(out))
"""


def in_sandbox(host, *checks, as_user=True):
    pid = host.check_output(f"systemctl show -p MainPID --value {UNIT}")
    assert pid not in ("", "0"), "the service is not running"
    user = "setpriv --reuid=sglang --regid=sglang --init-groups -- " if as_user else ""
    cmd = f"nsenter -t {pid} -m -- {user}python3 -c '{PROBE}' " + " ".join(f"'{c}'" for c in checks)
    return json.loads(host.check_output(cmd))


def test_the_caches_sglang_writes_are_writable_inside_the_sandbox(host):
    env = dict(line.split("=", 1) for line in host.file("/etc/sglang/sglang.env").content_string.splitlines()
               if "=" in line and not line.startswith("#"))
    checks = [f"write:{env['HF_HOME']}/modules/probe", f"write:{env['TRITON_CACHE_DIR']}/probe",
              f"write:{HOME}/.triton/cache/probe", f"write:{HOME}/.cache/flashinfer/probe",
              f"write:{HOME}/.cache/sglang/probe", "write:/dev/shm/nccl-probe"]
    assert in_sandbox(host, *checks) == {c: "ok" for c in checks}


def test_the_gpu_nodes_open_inside_the_sandbox(host):
    checks = ["open:/dev/nvidiactl", "open:/dev/nvidia-uvm", *(f"open:/dev/nvidia{i}" for i in range(8))]
    assert in_sandbox(host, *checks) == {c: "ok" for c in checks}


def test_writes_outside_the_writable_paths_are_denied_even_to_root_inside(host):
    checks = ["mkdir:/var/lib/other", "mkdir:/usr/probe", "mkdir:/etc/probe", "mkdir:/opt/sglang/probe"]
    # As root, so file permissions cannot be what denies them: the read-only mounts do.
    assert in_sandbox(host, *checks, as_user=False) == {c: "EROFS" for c in checks}
    outside = host.run("mkdir /var/lib/other && rmdir /var/lib/other")
    assert outside.rc == 0, "outside the service's namespace the same path is writable"


def test_other_users_homes_and_tmp_are_private(host):
    host.run("mkdir -p /root/probe-dir /tmp/probe-host")
    result = in_sandbox(host, "mkdir:/root/probe-dir/x", "mkdir:/tmp/probe-host", as_user=False)
    host.run("rm -rf /root/probe-dir /tmp/probe-host")
    # ProtectHome: /root is empty and read-only inside; PrivateTmp: the host's /tmp entry is not there.
    assert result == {"mkdir:/root/probe-dir/x": "ENOENT", "mkdir:/tmp/probe-host": "ok"}


def test_the_simulated_sglang_wrote_its_caches_through_the_sandbox(host):
    triton = host.run(f"find {HOME}/triton -name 'cuda_utils*' -user sglang").stdout.split()
    assert triton, "Triton's helper module, built at the first start, is in TRITON_CACHE_DIR"
    assert host.file(f"{HOME}/.cache/flashinfer").user == "sglang"
