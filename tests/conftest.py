import pytest
import torch as th


@pytest.fixture(autouse=True)
def _single_thread():
    """Tests run in parallel on 2 cores: one torch thread each keeps them from fighting."""
    th.set_num_threads(1)
    yield
