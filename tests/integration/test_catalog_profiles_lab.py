"""Every profile of profiles/catalog.yml served on a lab host with the role's defaults, as an operator deploys it
(serve-only, on the installed itest-1): each starts with Kimi K2.6's parsers and passes the correctness gate
(docs/correctness-gate.md), one after the other.

Cost (measured beside the simulator tests): 27-40 s a profile, about 4.5 minutes for the eight.

Measured in make test (fresh-clone run CI18, 2026-12-05, the lab job beside two others; wall, then CPU on the controller
+ in the lab hosts, tests/conftest.py's `cost:` lines): 330 s wall, 109 + 87 CPU-s (eight serve-only deploys with the
gate: about 24 CPU-s each).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from playbook import ROOT, SERVE_ONLY, on_host, run_playbook

pytestmark = pytest.mark.lab

PROFILES = list(yaml.safe_load((ROOT / "profiles" / "catalog.yml").read_text())["profiles"])
GATE = "Check what clients get (thinking, instant, a tool call, a known answer, no garbage)"


def test_every_catalog_profile_serves_with_the_parsers_and_passes_the_gate(lab_inventory: Path):
    served = {}
    for profile in PROFILES:
        run = run_playbook(lab_inventory, "deploy.yml", f"profile={profile}", "sglang_service_retry=true",
                           options=(*SERVE_ONLY, "--limit", "itest-1,localhost"))
        out = run.stdout + run.stderr
        assert run.returncode == 0, f"{profile}:\n{out[-3000:]}"
        gate = re.search(re.escape(GATE) + r"\] \**\n(\w+): \[itest-1\]", out)
        info = json.loads(on_host(lab_inventory, "itest-1", "curl -sf http://127.0.0.1:30000/server_info"))
        served[profile] = (gate.group(1) if gate else None, info["tool_call_parser"], info["reasoning_parser"],
                           info["sampling_defaults"])
    assert served == {p: ("ok", "kimi_k2", "kimi_k2", "model") for p in PROFILES}
