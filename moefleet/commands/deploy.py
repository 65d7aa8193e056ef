"""moefleet deploy: playbooks/deploy.yml (every host at once) with `moefleet rollout`'s conventions and machinery."""

from __future__ import annotations

import argparse

from moefleet.commands import rollout

DEPLOY = rollout.Kind("deploy", "deploy.yml", batches=False)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "deploy",
        help="deploy a profile to every host at once, with progress and a report",
        description=(
            "Run playbooks/deploy.yml (validate on the controller, then install, preflight and serve on every "
            "host at once; a host that falls back is reported degraded, not failed) through ansible-runner, with "
            "the conventions of moefleet rollout: -e profile=NAME (or each host's sglang_profile), -i (default: "
            "ansible.cfg's inventory), --limit, --check, --json, and a y/N confirmation on a terminal for hosts "
            "that serve another profile (--yes or -e confirm=yes for scripts; elsewhere refused). Prints one line "
            "per host state change, then the report. Ctrl-C stops after the running task, a second Ctrl-C at "
            "once. For a fleet in service, moefleet rollout (canary, batches, routers drained) is the safer "
            "command: behind routers (a group routers) deploy is refused before anything runs, since it does not "
            "drain, unless -e moefleet_maintenance_window=true (every worker at once, an announced outage); a "
            "host that ends degraded (on a fallback) counts as not serving the asked profile. "
            + rollout.EXIT_HELP
        ),
    )
    rollout.add_arguments(
        parser,
        DEPLOY,
        check_help="run playbooks/validate.yml's checks as deploy.yml does first (the profile catalog and each "
        "host's profile, the roles' argument specs, extra flags, references, the outage rule; they contact no host) "
        "and exit 2 with the real run's sentence on a refusal; then print the hosts and what would change on each, "
        "touching nothing: what each host serves from its local facts (read-only fact gathering)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    return rollout.execute(args, DEPLOY)
