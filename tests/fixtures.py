"""Small, real building blocks shared by tests: a tokenizer, a GLUE-shaped task folder and a tiny T5.

They are built from data the tests make (made_data.py: BBC News sentences that a dependency ships),
so the suite runs from a bare clone. Tests about the real GLUE, WikiText-2 and Tiny Shakespeare
files find them through one setting, T5_TRAINING_DATA (default: ../shared/data beside the
checkout), and skip without them, saying how to get them; with T5_TRAINING_REQUIRE_DATA=1 (as CI
sets) a missing file fails instead. The tokenizer is trained once per test process (about two
seconds) into a temporary folder.
"""
from __future__ import annotations

import atexit
import contextlib
import functools
import hashlib
import locale
import os
import shutil
import sys
import tempfile
import unittest
from unittest import mock

import datasets
from absl.testing import parameterized

from tests import made_data

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA_DIR = os.environ.get("T5_TRAINING_DATA") or os.path.normpath(os.path.join(REPO, "..", "shared", "data"))
TINY_CONFIG = os.path.join(REPO, "configs", "t5-tiny.json")


def real_data(*parts: str) -> str:
    """The path of a real data file or folder under T5_TRAINING_DATA; a skip (or, where required, a failure) without it."""
    path = os.path.join(DATA_DIR, *parts)
    if os.path.exists(path):
        return path
    message = (f"needs the real data file {path}: set T5_TRAINING_DATA to a folder holding GLUE's SST-2, CoLA, "
               "MRPC and STS-B, wikitext-2 and tinyshakespeare (docs/development.md says where to get them)")
    if os.environ.get("T5_TRAINING_REQUIRE_DATA") == "1":
        raise AssertionError(message)
    raise unittest.SkipTest(message)


def glue_dir() -> str:
    """A folder laid out like GLUE's download (SST-2/, CoLA/, STS-B/, MRPC/), made by the tests."""
    return made_data.glue_dir()


def sst2_dir() -> str:
    """The made SST-2 folder: GLUE's layout, labels the text decides (made_data.py)."""
    return os.path.join(made_data.glue_dir(), "SST-2")


def corpus_files() -> tuple[str, str]:
    """A made pretraining corpus, (train, held out): one paragraph a line, as WikiText's tokenized files."""
    return made_data.corpus_files()


def sentences(limit: int) -> list[str]:
    """`limit` English sentences of 6 to 40 words, the same on every machine."""
    return made_data.sentences(limit)


@functools.lru_cache(maxsize=None)
def tokenizer_dir(vocab_size: int = 1000) -> str:
    """A T5 SentencePiece tokenizer trained on the made sentences plus SST-2's label words."""
    from t5_training.tools import tokenizer

    # 100 copies of the label line make "positive" and "negative" one piece each and "sst2 sentence:"
    # the five pieces ▁s st 2 ▁sentence :, as the tests' golden lengths count them (50 leave
    # "negative" in four pieces on this text).
    texts = sentences(20000) + ["sst2 sentence: negative positive"] * 100
    cache = os.environ.get("T5_TRAINING_FIXTURE_CACHE")
    if cache:
        # Kept across processes (tools/mutation.py sets it: each mutant's tests run in a new process,
        # and training this tokenizer takes longer than most of them), under a name that changes
        # with everything the tokenizer is made from.
        with open(tokenizer.__file__, "rb") as f:
            made_from = hashlib.sha256(f.read() + "\n".join(texts).encode() + str(vocab_size).encode()).hexdigest()
        path = os.path.join(cache, f"tokenizer-{made_from[:16]}")
        if not os.path.isdir(path):
            tmp = tempfile.mkdtemp(prefix="tokenizer-", dir=os.makedirs(cache, exist_ok=True) or cache)
            tokenizer.train_tokenizer(texts, tmp, vocab_size=vocab_size)
            try:
                os.rename(tmp, path)  # whole or not at all; another process may have got there first
            except OSError:
                shutil.rmtree(tmp, ignore_errors=True)
        return path
    path = tempfile.mkdtemp(prefix="fixture-tokenizer-")
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    tokenizer.train_tokenizer(texts, path, vocab_size=vocab_size)
    return path


def tiny_model(seed: int = 0):
    """A randomly initialised tiny T5 (configs/t5-tiny.json), drawn with `seed`, sized to the fixture tokenizer."""
    import torch

    from t5_training import modeling

    torch.manual_seed(seed)
    return modeling.load_model(None, TINY_CONFIG, modeling.load_tokenizer(tokenizer_dir()))


def save_tiny_model(folder: str) -> str:
    """`tiny_model()` and its tokenizer saved in `folder`, as a user's pretrained model is; returns `folder`."""
    from t5_training import modeling

    tiny_model().save_pretrained(folder)
    modeling.load_tokenizer(tokenizer_dir()).save_pretrained(folder)
    return folder


def fine_tune_args(output_dir: str, *extra: str) -> list[str]:
    """Flags for a small, fast SST-2 run of fine_tune_t5.py on the tiny model: a fresh one, unless `extra`
    names a trained one (--model_name_or_path, which the scripts refuse beside --config_name)."""
    model = [] if "--model_name_or_path" in extra else ["--config_name", TINY_CONFIG]
    return [
        "--benchmark", "glue", "--dataset_name", "sst2", "--data_dir", sst2_dir(),
        *model, "--tokenizer_name", tokenizer_dir(),
        "--output_dir", output_dir, "--max_source_length", "64", "--max_target_length", "8",
        "--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "32",
        "--max_train_samples", "100", "--max_eval_samples", "32", "--logging_steps", "1",
        "--learning_rate", "1e-3", "--seed", "7", *extra,
    ]


def snapshot(root: str) -> dict:
    """Every folder and every file (with its bytes) under `root`: proof that a refused run changed nothing."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for d in dirs:
            found[os.path.relpath(os.path.join(folder, d), root) + "/"] = None
        for name in files:
            path = os.path.join(folder, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = f.read()
    return found


@contextlib.contextmanager
def ascii_locale():
    """The C locale while the block runs: open() without an encoding then reads ASCII, as on a host
    without a UTF-8 locale. Skips the test under Python's UTF-8 mode (fixed at start), which reads UTF-8 anyway."""
    if sys.flags.utf8_mode:
        raise unittest.SkipTest("Python's UTF-8 mode reads UTF-8 under any locale")
    previous = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield
    finally:
        locale.setlocale(locale.LC_CTYPE, previous)


class TempDirTestCase(parameterized.TestCase):
    """A fresh temp dir per test (`self.dir`), with datasets' cache inside it so loads leave nothing behind."""

    def setUp(self):
        super().setUp()
        tmp = tempfile.TemporaryDirectory()  # create_tempdir needs absl flags, which pytest does not parse
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        patcher = mock.patch.object(datasets.config, "HF_DATASETS_CACHE", os.path.join(self.dir, "hf_cache"))
        patcher.start()
        self.addCleanup(patcher.stop)


class SavedModelTestCase(parameterized.TestCase):
    """A temp dir for the class (`cls.tmp`) holding the tiny model saved once (`cls.base`), which runs start from."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.tmp = tempfile.mkdtemp()
        cls.base = save_tiny_model(os.path.join(cls.tmp, "base"))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)
        super().tearDownClass()


def tensorboard_scalars(run_dir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar a run logged with --report_to tensorboard: {key: [(step, value), ...]}."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    scalars: dict[str, list[tuple[int, float]]] = {}
    for root, _, names in os.walk(run_dir):
        for name in names:
            if name.startswith("events.out.tfevents"):
                accumulator = EventAccumulator(os.path.join(root, name))
                accumulator.Reload()
                for key in accumulator.Tags()["scalars"]:
                    scalars.setdefault(key, []).extend((e.step, e.value) for e in accumulator.Scalars(key))
    return {key: sorted(values) for key, values in scalars.items()}


def reset_accelerate_state() -> None:
    """Forgets the process's accelerate state, as a new process starts: the next Accelerator sets it afresh."""
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


# d_model 8, d_ff 16, 2 heads of 4, one layer each side, vocabulary 32: small enough to count by hand.
TINY_T5_SHAPE = dict(vocab_size=32, d_model=8, d_ff=16, d_kv=4, num_heads=2, num_layers=1, num_decoder_layers=1,
                     relative_attention_num_buckets=4)


def tiny_t5_config(**overrides):
    """A T5Config small enough to count its tensors by hand (memory and activation tests)."""
    import transformers

    values = dict(**TINY_T5_SHAPE, dropout_rate=0.1, feed_forward_proj="relu", tie_word_embeddings=True)
    values.update(overrides)
    config = transformers.T5Config(**values)
    # transformers 5's T5Config sets tie_word_embeddings to True whatever it is given; set afterwards
    # (as from_pretrained's keyword arguments are), an untied output layer holds.
    config.tie_word_embeddings = values["tie_word_embeddings"]
    return config


def tiny_t5(tie: bool = True):
    """A T5 of tiny_t5_config's shape without dropout, drawn with seed 0; `tie` False gives its output
    layer a copy of the embedding (transformers 5 always ties T5's), as other encoder-decoders have it."""
    import torch
    import transformers

    config = tiny_t5_config(dropout_rate=0.0, pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(config)
    if not tie:
        model.lm_head.weight = torch.nn.Parameter(model.shared.weight.detach().clone())
    return model


def tiny_t5_batch() -> dict:
    """Two rows for tiny_t5, one padded, with labels (-100 where padded)."""
    import torch

    ids = torch.tensor([[3, 4, 5, 1], [6, 7, 1, 0]])
    labels = torch.tensor([[8, 9, 1], [10, 1, -100]])
    return {"input_ids": ids, "attention_mask": (ids != 0).long(), "labels": labels}


def nan_on_steps(steps: set, accumulation: int = 1):
    """A forward_loss_sum that returns NaN on the micro-batches of the given (1-based) optimizer steps."""
    from unittest import mock

    from t5_training import losses

    real = losses.forward_loss_sum
    calls = []

    def patched(model, batch):
        calls.append(None)
        loss = real(model, batch)
        step = (len(calls) - 1) // accumulation + 1
        return loss * float("nan") if step in steps else loss

    return mock.patch.object(losses, "forward_loss_sum", patched)


@contextlib.contextmanager
def graphs_per_step():
    """Records each training step of `loop.train` as (its batches' shapes, the graphs torch.compile
    made during it), to show that a compiled run compiles once per shape and never after."""
    from torch._dynamo.utils import counters

    from t5_training import loop

    steps, real = [], loop.train_step

    def recording(accelerator, model, optimizer, window, *args, **kwargs):
        before = counters["stats"]["unique_graphs"]
        loss = real(accelerator, model, optimizer, window, *args, **kwargs)
        shapes = tuple(sorted((name, tuple(value.shape)) for batch in window for name, value in batch.items()))
        steps.append((shapes, counters["stats"]["unique_graphs"] - before))
        return loss

    with mock.patch.object(loop, "train_step", recording):
        yield steps


# The ops by which a tensor's value reaches the host: item(), bool(), and a tensor passed where an
# op takes a Python number (torch reads it first). On a GPU each waits for the work queued before it.
_HOST_READS = ("aten::_local_scalar_dense", "aten::is_nonzero", "aten::equal")


@contextlib.contextmanager
def host_reads():
    """Records every read of a tensor's value by the host, at the dispatcher (so reads made inside
    torch's own C++ count too), as the innermost Python frame outside torch that caused it:
    (file name, function name)."""
    import traceback

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    torch_dir = os.path.dirname(torch.__file__)
    reads = []

    class Recording(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func._schema.name in _HOST_READS:
                frame = next(f for f in reversed(traceback.extract_stack()) if not f.filename.startswith(torch_dir)
                             and f.filename != __file__)
                reads.append((os.path.basename(frame.filename), frame.name))
            return func(*args, **(kwargs or {}))

    with Recording():
        yield reads


def assert_compiled_once_per_shape(test, steps: list) -> None:
    """The first step compiled, and no step compiled a graph for shapes an earlier step had."""
    test.assertGreater(steps[0][1], 0, "the first step compiled nothing: the model is not compiled")
    seen = set()
    for number, (shapes, graphs) in enumerate(steps, 1):
        if shapes in seen:
            test.assertEqual(graphs, 0, f"step {number} compiled {graphs} graph(s) for shapes seen before: {shapes}")
        seen.add(shapes)


def coarse_matmuls() -> bool:
    """Whether the training runs this test process starts round their matmuls' inputs coarser than
    fp32: in the CUDA subset (T5_TRAINING_TEST_DEVICE=cuda), in bf16 autocast (--mixed_precision
    auto there) or in TF32 (runtime.build_accelerator allows it on GPUs for fp32 runs)."""
    from t5_training import device, runtime

    return device.runs_on_cuda() or runtime.resolve_mixed_precision("auto") == "bf16"


# Two runs that compute the same thing in another order (accumulated, split otherwise, with
# recomputed activations) differ by rounding alone. In fp32 that is of order 1e-6, and each test
# states its own fp32 bound. bf16 rounds the inputs of every matmul to an 8-bit mantissa (2^-9
# relative; TF32's 11 bits round finer), and the same pairs of runs then differ by up to 4.1e-4 of
# the loss (measured 2026-11-27 in bf16 autocast on a CPU, the largest of each: fine-tuning resumed
# under another split 4.1e-4, pretraining resumed so 1.2e-4, gradient checkpointing 1.1e-4). Runs
# over two processes are compared in fp32 on the CPU on any host (processes.py). 2e-3 leaves five times the
# largest; a real fault (a lost accumulation factor, a dropped micro-batch, a miscounted token)
# moves a loss by percents. Gradients, element by element against the tensor's largest, differed
# by up to 5.9e-3 (accumulation against one batch); 2e-2 leaves three times that, and the loss
# check beside it still catches a token miscounted (3%).
COARSE_RELATIVE = 2e-3
COARSE_GRADIENT = 2e-2


@contextlib.contextmanager
def deterministic_kernels():
    """torch's deterministic algorithms while the runs inside train on a GPU (the CUDA subset).

    There some kernels sum in the order their threads finish, so two runs of one computation may
    differ in the last bits (on a lent H200, 2026-11-27, resumed and uninterrupted runs logged the
    same losses and ended with a relative attention bias apart). A test that compares runs bitwise
    compares the code's order of work this way, not the GPU's scheduling. cuBLAS needs
    CUBLAS_WORKSPACE_CONFIG from its start for this, which conftest sets in the CUDA subset.
    """
    import torch
    from t5_training import device

    if not device.runs_on_cuda():
        yield
        return
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before)


def same_computation(fp32: float) -> float:
    """The relative bound between two runs of one computation in another order: the test's own fp32
    bound, or COARSE_RELATIVE where the runs' matmuls round coarser (coarse_matmuls)."""
    return COARSE_RELATIVE if coarse_matmuls() else fp32


def same_gradient(fp32: float) -> float:
    """As same_computation, for gradients element by element (relative to the tensor's largest)."""
    return COARSE_GRADIENT if coarse_matmuls() else fp32
