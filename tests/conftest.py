import zlib

import pytest
import torch as th


@pytest.fixture(autouse=True)
def _single_thread():
    """Tests run in parallel on 2 cores: one torch thread each keeps them from fighting."""
    th.set_num_threads(1)
    yield


@pytest.fixture(autouse=True)
def _seed_torch(request):
    """Seed torch's global generator from the test's id before every test.

    pytest-randomly reseeds ``random`` and numpy before each test, not torch, so a test drawing with ``th.randn``
    without seeding would see whatever state the tests before it (in this run's random order) left. Seeded from the
    test id, every test draws the same numbers in every order, alone or in the whole suite.
    """
    th.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    yield


@pytest.fixture
def continual(monkeypatch):
    """bench/continual.py as a module (``bench_continual``), with fewer bootstrap resamples (enough for the checks,
    fast; set where the statistics read them, bench/continual_report.py, and restored afterwards: that module is
    shared by every load); the torch thread count is restored afterwards (a run sets its own)."""
    from bench_modules import load_bench

    threads = th.get_num_threads()
    module = load_bench("continual")
    monkeypatch.setattr(module.continual_report, "REPS", 200)
    yield module
    th.set_num_threads(threads)
