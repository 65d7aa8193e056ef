"""`moefleet upgrade --to RELEASE`, run for real (the CLI, ansible-runner, ansible-playbook) on an inventory whose hosts
are never contacted: a release moefleet has no data for, --serve-only (an upgrade installs) and a second
sglang_package_spec are refused before anything runs; with --check, validate.yml judges the hosts for the new
release (a toolkit pinned for the old one is refused with the real run's sentence), and the new release's defaults
(its CUDA toolkit and driver branch) get past every check to the plan. About 15 s."""

from __future__ import annotations

from test_rollout_check_validates import loopback_inventory, moefleet, refused_as_the_real_run_refuses

from moefleet.commands.rollout import EXIT_BAD_INPUT, EXIT_UNREACHABLE


def test_a_release_without_data_is_refused_naming_the_supported_ones(tmp_path):
    done = moefleet("upgrade", "--to", "0.5.99", "-i", loopback_inventory(tmp_path / "hosts.yml"))
    assert done.returncode == EXIT_BAD_INPUT and done.stdout == "", done.stdout + done.stderr
    said = " ".join(done.stderr.split())
    assert said.startswith("moefleet upgrade: --to 0.5.99: "), said
    assert "0.5.10, 0.5.23" in said, said


def test_serve_only_and_a_second_spec_are_refused(tmp_path):
    inventory = loopback_inventory(tmp_path / "hosts.yml")
    serve_only = moefleet("upgrade", "--to", "0.5.23", "--serve-only", "-i", inventory)
    assert serve_only.returncode == EXIT_BAD_INPUT and "an upgrade installs the new release" in serve_only.stderr
    spec = moefleet("upgrade", "--to", "0.5.23", "-i", inventory, "-e", "sglang_package_spec=sglang==0.5.10")
    assert spec.returncode == EXIT_BAD_INPUT and "--to sets sglang_package_spec" in spec.stderr


def test_a_toolkit_pinned_for_the_old_release_is_refused_as_the_real_run_refuses_it(tmp_path):
    said = refused_as_the_real_run_refuses("upgrade", loopback_inventory(tmp_path / "hosts.yml"),
                                           ["--to", "0.5.23", "-e", "cuda_toolkit_version=12.9"], tmp_path / "r")
    assert said.startswith("moefleet upgrade: SGLang 0.5.23 is built for CUDA 13"), said
    assert "leave cuda_toolkit_version unset (it follows the pinned release: 13.0)" in said, said


def test_the_new_releases_defaults_get_past_the_checks_to_the_plan(tmp_path):
    check = moefleet("upgrade", "--to", "0.5.23", "--check", "-i", loopback_inventory(tmp_path / "hosts.yml"))
    assert check.returncode == EXIT_UNREACHABLE, check.stdout + check.stderr
    assert check.stdout.startswith("Rollout plan (serial [1, \"25%\", \"100%\"]; nothing was changed):"), check.stdout
    assert "loop-1  unreachable now (" in check.stdout, check.stdout
