"""How the tests and the bench run the collection's sglang_readiness module outside Ansible.

The tests run it in-process, as ceph-ansible's tests/library/ca_test_common.py does: the module's arguments set
with ansible-core's patch_module_args (set_module_args), AnsibleModule.exit_json and fail_json patched to raise
AnsibleExitJson / AnsibleFailJson with the result (no_log values removed from it, as ansible-core's own do), and
the module's main() called, in a thread when the test writes log lines while the module waits (ModuleRun).

The bench times it as Ansible runs it: a child process (the Python module
ansible_collections.moefleet.serving.plugins.modules.sglang_readiness, its module_utils imported as they are under
Ansible) with its JSON args file as argv[1] (module_command)."""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from pathlib import Path
from unittest import mock

from ansible.module_utils import basic
from ansible.module_utils.common.parameters import remove_values
from ansible.module_utils.testing import patch_module_args
from ansible_collections.moefleet.serving.plugins.modules import sglang_readiness

MODULE = "ansible_collections.moefleet.serving.plugins.modules.sglang_readiness"


def module_command(args_file: Path) -> list[str]:
    """The command line that runs the module in a child process with the JSON args in args_file."""
    return [sys.executable, "-m", MODULE, str(args_file)]


class AnsibleExitJson(Exception):  # noqa: N818 - ca_test_common's names
    """exit_json was called: the module succeeded (rc 0 under Ansible)."""


class AnsibleFailJson(Exception):  # noqa: N818
    """fail_json was called: the module failed (rc 1 under Ansible)."""


def _exit_json(module, **kwargs):
    raise AnsibleExitJson(remove_values(kwargs, module.no_log_values))


def _fail_json(module, msg, **kwargs):
    raise AnsibleFailJson(remove_values({**kwargs, "failed": True, "msg": msg}, module.no_log_values))


@contextlib.contextmanager
def set_module_args(args: dict, check_mode: bool = False):
    """The module's arguments for AnsibleModule, and exit_json/fail_json raising instead of exiting."""
    with (
        patch_module_args({**args, "_ansible_check_mode": check_mode}),
        mock.patch.object(basic.AnsibleModule, "exit_json", _exit_json),
        mock.patch.object(basic.AnsibleModule, "fail_json", _fail_json),
    ):
        yield


class ModuleRun(threading.Thread):
    """sglang_readiness's main() in a thread, with args: its result, whether it failed, and when it ended."""

    def __init__(self, args: dict, check_mode: bool = False) -> None:
        super().__init__(daemon=True)
        self._context = set_module_args(args, check_mode)
        self.result: dict | None = None
        self.failed: bool | None = None
        self.error: BaseException | None = None
        self.ended: float | None = None

    def start(self) -> ModuleRun:
        self._context.__enter__()
        super().start()
        return self

    def run(self) -> None:
        try:
            sglang_readiness.main()
        except AnsibleExitJson as done:
            self.result, self.failed = done.args[0], False
        except AnsibleFailJson as done:
            self.result, self.failed = done.args[0], True
        except BaseException as err:  # noqa: BLE001 - handed to the test by finish()
            self.error = err
        self.ended = time.monotonic()

    def running(self) -> bool:
        return self.is_alive()

    def finish(self, timeout: float = 30) -> tuple[dict, float]:
        """The module's result and the time (monotonic) it returned; the test fails when it has not by timeout."""
        self.join(timeout)
        try:
            assert not self.is_alive(), f"the module did not return within {timeout} s"
        finally:
            if not self.is_alive():
                self._context.__exit__(None, None, None)
        if self.error is not None:
            raise AssertionError(f"the module raised {self.error!r} instead of exit_json or fail_json") from self.error
        assert self.result is not None
        return self.result, self.ended


def run_module(args: dict, check_mode: bool = False, timeout: float = 30) -> tuple[dict, bool, float]:
    """Run the module to its end: its result, whether it failed, and the time it returned."""
    run = ModuleRun(args, check_mode).start()
    result, ended = run.finish(timeout)
    return result, run.failed, ended
