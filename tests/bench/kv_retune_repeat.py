#!/usr/bin/env python3
"""The KV-pool OOM retune, repeated: N consecutive deploys of tp2ep4 on one fresh lab host, each with
the simulator's `oom_kv_cache` fault on tp2ep4 and `sglang_service_retry=true` (so each deploy starts the
asked profile again instead of keeping what serves). Each deploy is counted by what the host's local facts
say afterwards: `retuned` when the asked profile serves and its last two starts are the KV-pool OOM and a
ready start with a higher --mem-fraction-static; otherwise by the outcome it ended on (restored, degraded,
failed). Prints a table and the share; asserts nothing (the rollback scenario holds the correctness claim).

    .venv/bin/python tests/bench/kv_retune_repeat.py [--runs 20]

Uses the lab `kvbench` (.lab/kvbench, removed at the end); about 40 s a deploy on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
from playbook import run_playbook, ssh_config_path  # noqa: E402

LAB = "kvbench"
FAULTS = json.dumps({"sim_faults": [{"fault": "oom_kv_cache", "profile": "tp2ep4"}]})


def lab(*args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "sim" / "lab" / "lab.py"), *args], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def host_facts(inventory: Path) -> dict:
    out = subprocess.run(["ssh", "-F", str(ssh_config_path(inventory)), f"{LAB}-1",
                          "cat /etc/ansible/facts.d/moefleet.fact"], capture_output=True, text=True).stdout
    return json.loads(out or "{}")


def verdict(facts: dict) -> str:
    history = facts.get("history") or []
    if facts.get("outcome") == "ready" and facts.get("serving_profile") == "tp2ep4" and len(history) >= 2:
        failed, served = history[-2:]
        if (failed.get("outcome"), failed.get("phase"), served.get("outcome")) == ("oom", "kv_cache", "ready") \
                and (served.get("tuning") or {}).get("mem_fraction_static", 0) > 0.79:
            return "retuned"
    return str(facts.get("outcome") or "no facts")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    inventory = ROOT / ".lab" / LAB / "hosts.yml"
    subprocess.run([sys.executable, str(ROOT / "sim" / "mirrors" / "build.py")], cwd=ROOT, check=True,
                   stdout=subprocess.DEVNULL)
    lab("down", "--name", LAB, "--inventory", str(inventory))
    lab("up", "--name", LAB, "--hosts", "1", "--inventory", str(inventory))
    counts: dict[str, int] = {}
    try:
        run_playbook(inventory, "sim/playbooks/prepare.yml")
        first = run_playbook(inventory, "deploy.yml", "profile=tp8")
        print(f"## KV-pool OOM retune of tp2ep4, {args.runs} consecutive deploys (host first serves tp8: "
              f"rc {first.returncode})")
        print(f"{'run':>3}  {'seconds':>7}  rc  verdict   mem_fraction_static")
        for n in range(1, args.runs + 1):
            started = time.monotonic()
            run = run_playbook(inventory, "deploy.yml", "profile=tp2ep4", "sglang_service_retry=true", FAULTS)
            seconds = time.monotonic() - started
            facts = host_facts(inventory)
            said = verdict(facts)
            counts[said] = counts.get(said, 0) + 1
            tuned = ((facts.get("history") or [{}])[-1].get("tuning") or {}).get("mem_fraction_static")
            print(f"{n:>3}  {seconds:>7.1f}  {run.returncode:>2}  {said:<8}  {tuned}", flush=True)
    finally:
        lab("down", "--name", LAB, "--inventory", str(inventory))
    print()
    print("verdicts: " + ", ".join(f"{k} {v}/{args.runs}" for k, v in sorted(counts.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
