"""pytest plugin of `tools/gpu_check.sh --rehearse` (`-p tests.gpu_rehearsal`): every test runs
under simulated_gpu.rehearse, the CUDA subset's decisions (bf16, padding to 8) on a CPU."""
import pytest

from tests import simulated_gpu


@pytest.fixture(autouse=True)
def _as_on_a_gpu():
    with simulated_gpu.rehearse():
        yield
