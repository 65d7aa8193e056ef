"""Lab hosts and the suite's controller only: keep the compiled code of Ansible's module payloads, as Python keeps
every installed module's.

Each task Ansible runs on a host arrives as a zip of Python sources (AnsiballZ: the module and the module_utils it
imports) that the host's Python imports from a new temporary directory. zipimport finds no bytecode in it and compiles
every source again, at each task, and it compiles each module twice (once to name its file, once to run it): about
0.07 of the 0.17 CPU-seconds a small module takes on the lab's build machine, and a lab job runs thousands of them on
hosts that share its two cores with the controller.

sim/lab/lab.py installs this file on every lab host beside a .pth line that imports it (site runs it at every start of
the system's Python; a venv's Python does not read it); tests/suite.py has the controller's Python import it too
(sim/lab/controller/sitecustomize.py, with CACHE from the environment). It puts one importer in front of zipimport's
for the paths of a module payload (`…_payload.zip`, the name Ansible gives it) that answers as zipimport does but
keeps each compiled source under CACHE, keyed by the source's hash and the interpreter's bytecode version, and gives
the code the file name of this run's payload. The modules run the same code: only the compiling is skipped. Anything
it cannot do (a source it cannot read, a cache it cannot write) falls back to zipimport's own behaviour. Real hosts
compile the payload at each task; the per-task CPU the lab measures is therefore lower than a real host's by that much.
"""

import _imp
import marshal
import os
import sys
import zipimport

CACHE = os.environ.get("MOEFLEET_LAB_ANSIBALLZ_CACHE", "/var/cache/moefleet-lab-ansiballz")  # the env: tests only
PAYLOAD = "_payload.zip"  # ansible/_internal/_ansiballz/_wrapper.py: ansible_<module>_payload.zip


class PayloadImporter(zipimport.zipimporter):
    """zipimport's importer for a module payload, with its compiled sources kept under CACHE."""

    def get_filename(self, fullname):
        # zipimport compiles the module to answer this (the import system asks it before it runs the module)
        base = os.path.join(self.archive, self.prefix, fullname.rpartition(".")[2])
        return os.path.join(base, "__init__.py") if self.is_package(fullname) else base + ".py"

    def get_code(self, fullname):
        try:
            source = self.get_source(fullname)
        except zipimport.ZipImportError:
            source = None
        if source is None:
            return super().get_code(fullname)
        import hashlib  # noqa: PLC0415  (only in a module run, not at every start of the system's Python)
        from importlib.util import MAGIC_NUMBER  # noqa: PLC0415

        path = self.get_filename(fullname)
        kept = os.path.join(CACHE, hashlib.sha256(MAGIC_NUMBER + source.encode("utf-8", "surrogateescape")).hexdigest())
        try:
            with open(kept, "rb") as fh:
                code = marshal.loads(fh.read())
            _imp._fix_co_filename(code, path)  # as importlib does for a cached module moved elsewhere
            return code
        except (OSError, ValueError, EOFError, TypeError):
            pass
        code = compile(source, path, "exec", dont_inherit=True)
        try:
            os.makedirs(CACHE, mode=0o700, exist_ok=True)
            partial = f"{kept}.{os.getpid()}"
            with open(partial, "wb") as fh:
                fh.write(marshal.dumps(code))
            os.replace(partial, kept)  # whole or absent for a task running beside this one
        except OSError:
            pass
        return code


def _payload_importer(path):
    if PAYLOAD in path:
        return PayloadImporter(path)
    raise ImportError("not a module payload")


if _payload_importer not in sys.path_hooks:
    sys.path_hooks.insert(0, _payload_importer)
