"""A GPU host simulated in the test process, for the code that decides by the device a run uses.

torch answers that a bf16-capable CUDA GPU is present; nothing may touch it (torch here may have
no CUDA at all), so tests under it call deciding functions, never build an Accelerator.
"""
import contextlib
import os
from unittest import mock

# accelerate's variables that say where and how a process runs; unset unless a test sets them.
_LAUNCH_VARIABLES = ("ACCELERATE_USE_CPU", "ACCELERATE_TORCH_DEVICE", "ACCELERATE_USE_DEEPSPEED",
                     "ACCELERATE_USE_FSDP", "DS_ACCELERATOR", "WORLD_SIZE")


@contextlib.contextmanager
def gpu_host(**env: str):
    """A host with a bf16 GPU, and exactly `env` of accelerate's launch variables set."""
    with mock.patch("torch.cuda.is_available", return_value=True), \
            mock.patch("torch.cuda.is_bf16_supported", return_value=True), mock.patch.dict(os.environ):
        for name in _LAUNCH_VARIABLES:
            os.environ.pop(name, None)
        os.environ.update(env)
        yield


def trains_as_on_a_gpu() -> bool:
    """In a rehearsal (`rehearse`): whether this process's runs take a GPU's decisions, which they
    do unless told to use the CPU, as device.runs_on_cuda would answer on a GPU host."""
    from accelerate.utils import parse_flag_from_env

    return not parse_flag_from_env("ACCELERATE_USE_CPU")


@contextlib.contextmanager
def rehearse():
    """The CUDA subset's decisions on a CPU: runs in this process train in bf16 autocast on batches
    padded to 8, compiled fine-tuning pads to the GPU's widths, and tests take bf16's tolerances.

    For `tools/gpu_check.sh --rehearse` (tests/gpu_rehearsal.py): the tests a GPU's precision and
    padding would fail, found without a GPU. The kernels are still the CPU's, and the process
    launches nothing on a GPU: what only the device shows (host syncs, its kernels' rounding, its
    memory) the GPU check alone measures.
    """
    from t5_training import batching, data, runtime

    decide = runtime.resolve_mixed_precision

    def resolve_mixed_precision(requested: str) -> str:
        return "bf16" if requested == "auto" and trains_as_on_a_gpu() else decide(requested)

    # fixtures.coarse_matmuls follows from the precision: bf16's tolerances come with it.
    with mock.patch.object(runtime, "resolve_mixed_precision", resolve_mixed_precision), \
            mock.patch.object(batching, "runs_on_cuda", trains_as_on_a_gpu), \
            mock.patch.object(data, "pad_multiple", batching.pad_multiple):
        yield
