# pytest puts this directory on sys.path (rootdir conftest, no __init__.py), so tests can import the
# helpers beside it (readiness_module.py).
