"""export.py: best/ and final/ load with from_pretrained, replace the previous export whole, or leave it as it was."""
import collections
import os
from unittest import mock

from absl.testing import absltest
import accelerate
import torch
import transformers
from safetensors.torch import load_file

from t5_training import adapters, checkpoint, export
from t5_training.errors import WriteError
from tests import fixtures


def _tiny_t5():
    torch.manual_seed(0)
    config = transformers.T5Config(vocab_size=64, d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1)
    return transformers.T5ForConditionalGeneration(config)


def _stale_tmp(path):
    """`<path>.tmp` holding files, as an export killed mid-write leaves it (a manifest too: none may reach the export)."""
    os.makedirs(f"{path}.tmp")
    for name in ("weights.bin", checkpoint.MANIFEST):
        with open(os.path.join(f"{path}.tmp", name), "w") as f:
            f.write("stale")


class ExportModelTest(fixtures.TempDirTestCase):

    def setUp(self):
        super().setUp()
        self.out = os.path.join(self.dir, "out")

    def test_export_loads_with_from_pretrained(self):
        accelerator = accelerate.Accelerator(cpu=True)
        model = accelerator.prepare(_tiny_t5())
        os.makedirs(self.out)
        path = os.path.join(self.out, "best")
        _stale_tmp(path)  # from a killed export
        export.export_model(accelerator, model, None, path)

        self.assertEqual(sorted(os.listdir(self.out)), ["best"])
        files = os.listdir(path)
        self.assertIn("model.safetensors", files)
        self.assertIn("config.json", files)
        self.assertNotIn("pytorch_model.bin", files)
        loaded = transformers.T5ForConditionalGeneration.from_pretrained(path)
        self.assertEqual(loaded.config.d_model, 16)
        expected = model.state_dict()
        for key, value in loaded.state_dict().items():
            torch.testing.assert_close(value, expected[key], rtol=0, atol=0, msg=key)
        ids = torch.tensor([[5, 6, 7, 1]])
        model.eval()  # from_pretrained returns an eval-mode model; compare without dropout
        with torch.no_grad():
            torch.testing.assert_close(loaded(input_ids=ids, decoder_input_ids=ids).logits,
                                       model(input_ids=ids, decoder_input_ids=ids).logits)

    def test_a_compiled_model_exports_under_its_own_names_and_an_adapter_as_an_adapter(self):
        # torch.compile's wrapper (lazy: nothing compiles here) holds the model as `_orig_mod`, which
        # accelerate leaves in every weight name; from_pretrained must find the model's own names, and
        # a peft model under the wrapper must still be exported as an adapter.
        import peft

        accelerator = accelerate.Accelerator(cpu=True)
        plain = _tiny_t5()
        lora = peft.get_peft_model(_tiny_t5(), peft.LoraConfig(task_type="SEQ_2_SEQ_LM", r=2, target_modules=["q"]))
        for name, model in (("plain", plain), ("lora", lora)):
            export.export_model(accelerator, torch.compile(model), None, os.path.join(self.out, name))
        self.assertFalse([n for n in load_file(os.path.join(self.out, "plain", "model.safetensors")) if "_orig" in n])
        loaded = transformers.T5ForConditionalGeneration.from_pretrained(os.path.join(self.out, "plain"))
        for key, value in loaded.state_dict().items():
            torch.testing.assert_close(value, plain.state_dict()[key], rtol=0, atol=0, msg=key)
        self.assertTrue(os.path.isdir(os.path.join(self.out, "lora", adapters.ADAPTER_DIR)))

    def test_export_replaces_previous(self):
        accelerator = accelerate.Accelerator(cpu=True)
        model = accelerator.prepare(_tiny_t5())
        path = os.path.join(self.out, "best")
        export.export_model(accelerator, model, None, path)
        with torch.no_grad():
            model.shared.weight.add_(1.0)
        with open(os.path.join(path, "stale.txt"), "w") as f:
            f.write("old")
        export.export_model(accelerator, model, None, path)
        self.assertNotIn("stale.txt", os.listdir(path))
        loaded = transformers.T5ForConditionalGeneration.from_pretrained(path)
        torch.testing.assert_close(loaded.shared.weight, model.shared.weight, rtol=0, atol=0)

    def test_the_gathered_state_dict_is_exported_with_the_tokenizer_and_nothing_stale(self):
        # Under ZeRO-3 the model's own tensors are placeholders: the weights are the ones get_state_dict gathers.
        accelerator = accelerate.Accelerator(cpu=True)
        model = accelerator.prepare(_tiny_t5())
        gathered = {name: value + 1.0 for name, value in model.state_dict().items()}
        path = os.path.join(self.out, "best")
        _stale_tmp(path)  # from a killed export: none of it may reach the new one
        with mock.patch.object(accelerator, "get_state_dict", return_value=gathered) as get_state_dict:
            export.export_model(accelerator, model, _Tokenizer(), path)
        get_state_dict.assert_called_once_with(model)
        self.assertEqual(sorted(os.listdir(self.out)), ["best"])
        files = os.listdir(path)
        self.assertIn("tokenizer.json", files)
        self.assertNotIn("weights.bin", files)
        self.assertNotIn(checkpoint.MANIFEST, files)
        loaded = transformers.T5ForConditionalGeneration.from_pretrained(path).state_dict()
        for key, value in gathered.items():
            torch.testing.assert_close(loaded[key], value, rtol=0, atol=0, msg=key)

    def test_an_adapter_model_is_written_by_the_adapters_module(self):
        accelerator = accelerate.Accelerator(cpu=True)
        model = accelerator.prepare(_tiny_t5())
        unwrapped = accelerator.unwrap_model(model)
        gathered = model.state_dict()
        path = os.path.join(self.out, "best")

        def save_adapter(adapter_model, state_dict, folder, final=None):
            os.makedirs(os.path.join(folder, "adapter"))
            open(os.path.join(folder, "adapter", "adapter_model.safetensors"), "w").close()

        with mock.patch.object(accelerator, "get_state_dict", return_value=gathered), \
                mock.patch.object(export.adapters, "is_adapter_model", side_effect=lambda m: m is unwrapped), \
                mock.patch.object(export.adapters, "save_pretrained", side_effect=save_adapter) as save:
            export.export_model(accelerator, model, None, path)
        save.assert_called_once_with(unwrapped, gathered, f"{path}.tmp", final=path)
        self.assertEqual(fixtures.snapshot(self.out), {"best/": None, "best/adapter/": None,
                                                       "best/adapter/adapter_model.safetensors": b""})

    def test_only_the_main_process_writes(self):
        # Every process gathers the weights (a collective under ZeRO-3); one writes, and all agree on the outcome.
        model = _tiny_t5()
        accelerator = mock.Mock(num_processes=2, device="cpu", is_main_process=False)
        accelerator.unwrap_model.return_value = model
        accelerator.get_state_dict.return_value = model.state_dict()
        accelerator.reduce.side_effect = lambda flag, reduction: flag
        export.export_model(accelerator, model, _Tokenizer(), os.path.join(self.out, "best"))
        accelerator.get_state_dict.assert_called_once_with(model)
        accelerator.reduce.assert_called_once()
        self.assertFalse(os.path.exists(self.out))


class _Tokenizer:
    """Writes a tokenizer file where save_pretrained is told to."""

    def save_pretrained(self, folder):
        with open(os.path.join(folder, "tokenizer.json"), "w") as f:
            f.write("{}")


_Usage = collections.namedtuple("_Usage", "total used free")


class FailedExportTest(fixtures.TempDirTestCase):

    def setUp(self):
        super().setUp()
        self.out = os.path.join(self.dir, "out")
        self.accelerator = accelerate.Accelerator(cpu=True)
        # 1.5 MiB free wherever asked: the message reports it to one decimal.
        patcher = mock.patch.object(checkpoint.shutil, "disk_usage", return_value=_Usage(0, 0, 3 * 2**19))
        patcher.start()
        self.addCleanup(patcher.stop)

    def test_a_failed_export_keeps_the_previous_one(self):
        model = self.accelerator.prepare(_tiny_t5())
        path = os.path.join(self.out, "best")
        export.export_model(self.accelerator, model, None, path)
        before = fixtures.snapshot(self.out)
        tokenizer = mock.Mock()
        tokenizer.save_pretrained.side_effect = OSError(28, "No space left on device")
        with self.assertRaisesRegex(WriteError, f"could not write {path} \\(No space left on device; 1.5 MiB free in "
                                                f"{self.out}\\)"):
            export.export_model(self.accelerator, model, tokenizer, path)
        self.assertEqual(fixtures.snapshot(self.out), before)  # no best.tmp, the previous export as it was


if __name__ == "__main__":
    absltest.main()
