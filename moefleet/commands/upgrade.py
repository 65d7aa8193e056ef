"""moefleet upgrade --to RELEASE: `moefleet rollout` of another SGLang release, each host compared old against new."""

from __future__ import annotations

import argparse
import json
import sys

from ansible_collections.moefleet.serving.plugins.module_utils import sglang_releases

from moefleet import runner
from moefleet.commands import rollout

UPGRADE = rollout.Kind("upgrade", "rollout.yml", batches=True)
# The requirement the upgrade pins: the same extra as the roles' default (roles/moefleet_defaults).
SPEC = "sglang[all]=={release}"


def register(subparsers: argparse._SubParsersAction) -> None:
    supported = ", ".join(sglang_releases.SUPPORTED)
    parser = subparsers.add_parser(
        "upgrade",
        help="move the fleet to another SGLang release: canary first, old against new on each host, batches",
        description=(
            "Roll another SGLang release out as moefleet rollout rolls a profile out (playbooks/rollout.yml: "
            "canary, then batches, each host drained out of the routers first), with -e sglang_package_spec="
            f"'{SPEC.format(release='RELEASE')}'; the same through ansible-playbook: ansible-playbook "
            "playbooks/rollout.yml -e sglang_package_spec='sglang[all]==RELEASE'. Each host installs the new "
            "release beside the one that serves (sglang_venvs_dir/RELEASE, with the CUDA toolkit it is built for), "
            "measures the old release with a short benchmark, starts the new one, runs readiness and the "
            "correctness gate, measures it the same way and keeps it unless it is slower than "
            "sglang_service_compare_tolerance (10 %) plus the run-to-run noise; a slower or failing release is "
            "switched back to the last unit that served (the old release's virtualenv: no pip), and the rollout "
            "stops there, the hosts after it untouched. The report shows old against new per host. Supported "
            f"releases: {supported}. " + rollout.EXIT_HELP
        ),
    )
    parser.add_argument("--to", required=True, metavar="RELEASE",
                        help=f"the SGLang release to move to ({supported})")
    rollout.add_arguments(
        parser,
        UPGRADE,
        check_help="run playbooks/validate.yml's checks for the new release (its flags, parsers, the CUDA toolkit "
        "and driver it needs) as the real run does, touching nothing, and print the batches",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    problem = sglang_releases.release_problem(SPEC.format(release=args.to))
    if problem:
        print(f"moefleet upgrade: --to {args.to}: {problem}", file=sys.stderr)
        return rollout.EXIT_BAD_INPUT
    if args.serve_only:
        print("moefleet upgrade: --serve-only skips the install steps, and an upgrade installs the new release; "
              "leave it out.", file=sys.stderr)
        return rollout.EXIT_BAD_INPUT
    try:
        given = rollout.parse_extra_vars(args.extra_vars)
    except runner.BadInput:
        given = {}  # rollout.execute refuses it, with its sentence
    if "sglang_package_spec" in given:
        print("moefleet upgrade: --to sets sglang_package_spec; leave it out of -e.", file=sys.stderr)
        return rollout.EXIT_BAD_INPUT
    args.extra_vars = [*args.extra_vars, json.dumps({"sglang_package_spec": SPEC.format(release=args.to)})]
    return rollout.execute(args, UPGRADE)
