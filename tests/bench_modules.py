"""Import a script of ``bench/`` (not a package) as a module for the tests."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parent.parent / "bench"


def load_bench(script: str) -> ModuleType:
    """Execute ``bench/<script>.py`` as module ``bench_<script>`` (registered in ``sys.modules``, where
    dataclasses look their module up) and return it."""
    spec = importlib.util.spec_from_file_location(f"bench_{script}", BENCH / f"{script}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module
