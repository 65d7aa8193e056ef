"""The oracle tests need the oracle venv (make oracle-env); without it they fail, saying so."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import env  # noqa: E402


def pytest_collection_modifyitems(items):
    for item in items:
        if Path(str(item.fspath)).parent == Path(__file__).resolve().parent:
            item.add_marker(pytest.mark.oracle)


@pytest.fixture(scope="session", autouse=True)
def oracle_venv():
    missing = [f"sglang {v} ({env.cache_dir(v)})" for v in env.supported() if not env.ready(v)]
    if missing:
        pytest.fail(f"The real-SGLang oracle is not built for {', '.join(missing)}: run `make oracle-env` "
                    "(needs PyPI once).", pytrace=False)
