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
