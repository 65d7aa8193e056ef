"""The suite's controller only: the module payloads Ansible runs on the controller itself keep their bytecode, as the
lab hosts' do (sim/lab/ansiballz_bytecode.py says how, and what a real machine does instead).

tests/suite.py puts this directory first on PYTHONPATH and MOEFLEET_LAB_ANSIBALLZ_CACHE in the environment of every
job, so every Python it starts imports this file at its start (`site` imports the first sitecustomize on sys.path).
A task with connection local or delegate_to localhost (validate.yml's checks, the gateway's routes, the rollout's
plan) runs its payload in the controller's Python, which compiles the payload's sources at each task as a lab host
did. This file only puts the importer of sim/lab/ansiballz_bytecode.py in front of zipimport's: it answers for module
payloads alone, so the other processes (pytest, ansible-playbook, molecule) run as they would without it.
"""

import importlib.util
import os

if os.environ.get("MOEFLEET_LAB_ANSIBALLZ_CACHE"):  # without it, the hook would write to the lab hosts' cache path
    _path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "ansiballz_bytecode.py")
    _spec = importlib.util.spec_from_file_location("moefleet_lab_ansiballz_bytecode", _path)
    if _spec and _spec.loader:
        _spec.loader.exec_module(importlib.util.module_from_spec(_spec))
