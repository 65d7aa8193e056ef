"""Jinja2 filter of the benchmark sweep (playbooks/bench.yml) over plugins/module_utils/bench_report.py:
moefleet.serving.bench_prompts, the --num-prompts of one concurrency level."""

from __future__ import annotations

from ansible.errors import AnsibleFilterError
from ansible_collections.moefleet.serving.plugins.module_utils.bench_report import prompts_for


def bench_prompts(concurrency, minimum=8, per_concurrency=2, maximum=512):
    """``{{ 64 | moefleet.serving.bench_prompts(8, 2, 512) }}`` -> 128: min(maximum, max(minimum, per × C))."""
    try:
        return prompts_for(concurrency, minimum, per_concurrency, maximum)
    except (TypeError, ValueError) as exc:
        raise AnsibleFilterError(f"moefleet.serving.bench_prompts: {exc}") from None


class FilterModule:
    """The benchmark sweep's filters, called as moefleet.serving.<name>."""

    def filters(self):
        return {"bench_prompts": bench_prompts}
