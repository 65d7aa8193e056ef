"""Print, per catalog profile, what real SGLang computes against what the planner and the simulator compute.

``.venv/bin/python tests/oracle/table.py [OUT.md]`` (needs ``make oracle-env``). Every profile is run
with its flags as shipped and, for the default columns, without ``mem_fraction_static``.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import oracle  # noqa: E402
from ansible_collections.moefleet.serving.plugins.module_utils import planner  # noqa: E402


def main() -> None:
    profiles = oracle.catalog()["profiles"]
    config = oracle.model_config()
    requests = []
    for flags in profiles.values():
        for fl in (oracle.without_mem_fraction(flags["flags"]), flags["flags"]):
            requests.append({"op": "server_args", "model_config": config,
                             "argv": oracle.rendered_args(fl, oracle.role_defaults("sglang_service"))})
    answers = oracle.ask(requests)
    rows = ["| profile | SGLang default mfs | planner default mfs | sim default mfs (server_info) "
            "| SGLang chunked_prefill / cuda_graph_max_bs | sim chunked_prefill / cuda_graph_max_bs "
            "| profile's mfs | SGLang mfs with profile flags |",
            "|---|---|---|---|---|---|---|---|"]
    for i, (name, profile) in enumerate(profiles.items()):
        default, shipped = answers[2 * i], answers[2 * i + 1]
        real = default["server_args"] if default.get("ok") else {}
        try:
            plan_mfs = planner.plan(config, oracle.GPUS, oracle.GPU_MEMORY_GIB,
                                    oracle.without_mem_fraction(profile["flags"]),
                                    smi_memory_mib=oracle.SMI_MEMORY_MIB,
                                    release=oracle.env.pinned_version()).mem_fraction_static
            plan_mfs = f"{plan_mfs:.4f}"
        except Exception as exc:  # noqa: BLE001 - the table reports what each side does
            plan_mfs = f"error: {exc}"
        sim = oracle.run_simulator(oracle.rendered_args(oracle.without_mem_fraction(profile["flags"]),
                                                        oracle.role_defaults("sglang_service")))
        info = sim["server_info"] or {}
        sim_mfs = info.get("mem_fraction_static", "did not serve")
        sim_mfs = f"{sim_mfs:.4f}" if isinstance(sim_mfs, float) else sim_mfs
        real_mfs = f"{real['mem_fraction_static']:.4f}" if real else default.get("error")
        shipped_mfs = (f"{shipped['server_args']['mem_fraction_static']}" if shipped.get("ok")
                       else shipped.get("error"))
        rows.append(f"| {name} | {real_mfs} | {plan_mfs} | {sim_mfs} "
                    f"| {real.get('chunked_prefill_size')} / {real.get('cuda_graph_max_bs')} "
                    f"| {info.get('chunked_prefill_size')} / {info.get('cuda_graph_max_bs')} "
                    f"| {profile['flags'].get('mem_fraction_static')} | {shipped_mfs} |")
    text = "\n".join(rows) + "\n"
    print(text)
    if len(sys.argv) > 1:
        Path(sys.argv[1]).write_text(text)


if __name__ == "__main__":
    main()
