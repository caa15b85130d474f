"""What autograd saves in one T5 training step, tensor by tensor, and when backward frees it.

`trace` runs T5ForConditionalGeneration's forward symbolically, op by op as transformers'
modeling_t5.py (default SDPA attention) and the project's fp32 cross entropy run it, and records
for each autograd node the storages it saves (deduplicated by storage) and the gradients that
exist while backward runs it, on `autograd_tape.Tape`, whose `activation_profile` walks the nodes
in backward order.
`t5_training.tools.memory` turns that into the activations term of its estimate, and
`tests/memory_test.py` checks the saved bytes against what autograd really saves.

Per token of a layer, with everything trainable, fp32 and dropout > 0 on the CPU (d = d_model, i = num_heads *
d_kv, f = d_ff, H = heads, L = keys attended):

    encoder layer  4 * (8d + 2 + 4i + 3f) + 12 * H * L bytes
        8d: each layer norm saves its input, its normalized value and its output (the next matmul's
        input), and each of the two sublayer outputs its dropout mask; 2: the per-token rsqrt of
        both norms; 4i: q, k, v (copied for batched matmuls) and the attention output; 3f: ReLU
        output, its dropout mask and the dropped values; 12HL: softmax output, its dropout mask and
        the dropped probabilities: the L x L terms that dominate long inputs.
    decoder layer  the same with a cross-attention sublayer: +4 * (4d + 1 + 2i) + 12 * H * source
        per target token, and k, v of the encoder output (2 * source * i * 4 per layer).

Variants follow the code: ReLU becomes gated-GELU in T5 v1.1 (5f instead of 3f: the GELU's input,
both factors of the gate, its dropout mask and the dropped values; `modeling.fuse_gelu` runs the
GELU as one kernel); dropout 0 saves no masks; CUDA keeps 1-byte dropout masks, and runs a fused
attention kernel (q, k, v, output and the bias, no L x L probabilities) only where the bias is
constant (cross-attention, or a frozen position bias: a trained one gets SDPA's math kernel, in
fp32, on either device); autocast saves 16-bit copies of each matmul's input and weight while
norms, the residual stream and softmax stay fp32. Outside the layers: the embedding lookups,
the final norms and, for the loss, the fp32 log-probabilities (target tokens x vocabulary), which
the cross entropy keeps. Frozen parameters need no gradient, no optimizer state, and spare the
activations only their own weight gradient needed.

The peak is followed through the step rather than summed: backward runs the autograd nodes in
reverse, freeing each saved tensor after the first node that saved it, while parameter gradients
appear layer by layer and each node needs its output's and inputs' gradients meanwhile (for the
loss: two more log-prob-sized tensors). With gradient checkpointing, only each layer's inputs
stay, and one layer's tensors exist again while backward recomputes it.
"""
from __future__ import annotations

import re

from t5_training.errors import UsageError
from t5_training.tools import adapter_memory
from t5_training.tools.autograd_tape import Storage, Tape


def trace(cfg, *, batch: int, source: int, target: int, trainable: dict[str, bool], device: str, precision: str,
          pure16: bool, checkpointing: bool, padding: bool,
          adapters: adapter_memory.AdapterLayers | None = None) -> tuple[Tape, list[str]]:
    """One training forward of T5ForConditionalGeneration plus the project's fp32 cross entropy
    (`losses.token_cross_entropy_sum`), stage by stage in the order backward undoes them. With
    `adapters` (adapter_memory.describe), the adapted layers and a prompt's positions are traced too."""
    tape = Tape(device=device, precision=precision, pure16=pure16, dropout=cfg.dropout_rate,
                checkpointing=checkpointing)
    forward = _Forward(cfg, tape, batch=batch, source=source, target=target, trainable=trainable,
                       checkpointing=checkpointing, padding=padding, matmul_bytes=4 if precision == "fp32" else 2,
                       adapters=adapters)
    encoded = forward.encoder()
    y = forward.decoder(encoded)
    forward.head_and_loss(y)
    return tape, forward.stages


class _Forward:
    """The stages of one T5 forward, recorded on a Tape: embeddings, blocks, final norms, head, loss."""

    def __init__(self, cfg, tape: Tape, *, batch: int, source: int, target: int, trainable: dict[str, bool],
                 checkpointing: bool, padding: bool, matmul_bytes: int, adapters=None):
        self.prompt = adapters.prompt_tokens if adapters else 0
        # The encoder reads the prompt's positions too; `source` is the data's length.
        self.cfg, self.tape, self.batch, self.source, self.target = cfg, tape, batch, source + self.prompt, target
        self.adapters = adapters
        self.matmul_bytes = matmul_bytes
        self.trainable, self.checkpointing, self.padding = trainable, checkpointing, padding
        self.d, self.inner, self.d_ff = cfg.d_model, cfg.num_heads * cfg.d_kv, cfg.d_ff
        self.heads, self.vocab = cfg.num_heads, cfg.vocab_size
        self.stages: list[str] = []

    def begin(self, name: str) -> None:
        self.tape.stage = len(self.stages)
        self.stages.append(name)

    def embed(self, length: int, prompt: int = 0) -> Storage:
        tape = self.tape
        tokens = self.batch * (length - prompt)
        # Gradient checkpointing makes the embedding output require grad (enable_input_require_grads).
        out = tape.new(tokens * self.d, tape.weight_bytes, self.trainable["embeddings"] or self.checkpointing)
        tape.node([(tape.new(tokens, 8, False), self.trainable["embeddings"])], [out])  # saves the token ids
        if prompt:
            out = adapter_memory.prompt(tape, out, batch=self.batch, tokens=prompt, d_model=self.d)
        return tape.dropout(out)

    def linear(self, module: str, x: Storage, n_in: int, n_out: int, trainable: bool) -> Storage:
        return adapter_memory.linear(self.tape, self.adapters, module, x, n_in, n_out, trainable)

    def relative_bias(self, length: int, trainable_bias: bool) -> Storage:
        tape = self.tape
        values = tape.new(self.heads * length * length, tape.weight_bytes, trainable_bias)  # a permuted view
        tape.node([(tape.new(length * length, 8, False), trainable_bias)], [values])  # saves the buckets
        return values

    def where(self, condition: Storage, bias: Storage, rows: int) -> Storage:  # create_position_bias_mask, in every layer
        out = self.tape.new(rows * bias.numel, bias.itemsize, bias.rg)
        self.tape.node([(condition, bias.rg)], [out, out])  # the bias's gradient before summing over the batch
        return out

    def sublayer_output(self, x: Storage, y: Storage) -> Storage:
        tape = self.tape
        x = tape.add(x, tape.dropout(y))
        if tape.clamp:  # torch.clamp saves its input
            out = tape.new(x.numel, x.itemsize, x.rg)
            tape.node([(x, x.rg)], [out, x])
            x = out
        return x

    def attention(self, module: str, x: Storage, length: int, bias: Storage, tr: bool, keys: Storage | None = None,
                  key_length: int = 0) -> Storage:
        """Self-attention (keys None) or cross-attention over `keys`, with its output projection."""
        tape, d, inner = self.tape, self.d, self.inner
        h = tape.layer_norm(x, self.batch * length, tr)
        q = self.linear(f"{module}.q", h, d, inner, tr)
        k, v = (self.linear(f"{module}.{name}", h if keys is None else keys, d, inner, tr) for name in "kv")
        a = tape.attention(q, k, v, bias, batch=self.batch, heads=self.heads, queries=length,
                           keys=key_length or length)
        return self.sublayer_output(x, self.linear(f"{module}.o", a, inner, d, tr))

    def block(self, name: str, x: Storage, length: int, bias: Storage, tr: bool, cross: tuple[Storage, Storage] | None = None) -> Storage:
        """One T5Block; `name` is its module's, e.g. encoder.block.0 (adapters are found by name)."""
        tape, d, d_ff = self.tape, self.d, self.d_ff
        x = self.attention(f"{name}.layer.0.SelfAttention", x, length, bias, tr)
        if cross:
            encoded, cross_bias = cross
            x = self.attention(f"{name}.layer.1.EncDecAttention", x, length, cross_bias, tr, keys=encoded,
                               key_length=self.source)
        ff = f"{name}.layer.{2 if cross else 1}.DenseReluDense"
        h = tape.layer_norm(x, self.batch * length, tr)
        if self.cfg.is_gated_act:
            y = tape.mul(tape.gelu(self.linear(f"{ff}.wi_0", h, d, d_ff, tr)),
                         self.linear(f"{ff}.wi_1", h, d, d_ff, tr))
        else:
            y = tape.relu(self.linear(f"{ff}.wi", h, d, d_ff, tr))
        y = tape.cast(tape.dropout(y), tape.weight_bytes)  # .to(wo.weight.dtype)
        return self.sublayer_output(x, self.linear(f"{ff}.wo", y, d_ff, d, tr))

    def encoder(self) -> Storage:
        tape, batch, source, tr = self.tape, self.batch, self.source, self.trainable["encoder"]
        self.begin("encoder embedding")
        x = self.embed(source, prompt=self.prompt)
        padding_mask = tape.new(batch * source * source, 1, False) if self.padding else None
        for layer in range(self.cfg.num_layers):
            self.begin(f"encoder layer {layer}")
            if layer == 0:
                bias = self.relative_bias(source, tr)  # computed by the first layer, passed on to the others
            tape.kept[tape.stage] = {t.key for t in (x, padding_mask, bias if layer else None) if t}
            # The bias is a permuted view: .contiguous() copies it when no padding mask is combined in.
            mask = (self.where(padding_mask, bias, batch) if self.padding
                    else tape.new(bias.numel, bias.itemsize, bias.rg))
            x = self.block(f"encoder.block.{layer}", x, source, mask, tr)
        self.begin("encoder final norm")
        return tape.dropout(tape.layer_norm(x, batch * source, tr))

    def decoder(self, encoded: Storage) -> Storage:
        tape, batch, source, target, tr = self.tape, self.batch, self.source, self.target, self.trainable["decoder"]
        self.begin("decoder embedding")
        y = self.embed(target)
        cross_mask = tape.new(batch * target * source, 1, False) if self.padding else None
        for layer in range(self.cfg.num_decoder_layers):
            self.begin(f"decoder layer {layer}")
            if layer == 0:
                bias = self.relative_bias(target, tr)
                # Layers without a relative bias add zeros; under checkpointing these require grad.
                zeros = tape.new(self.heads * target * source, self.matmul_bytes, self.checkpointing)
            tape.kept[tape.stage] = {t.key for t in (y, encoded, cross_mask, bias if layer else None,
                                                     zeros if layer else None) if t}
            causal = self.where(tape.new(target * target, 1, False), bias, 1)
            cross_bias = self.where(cross_mask, zeros, batch) if self.padding else zeros
            y = self.block(f"decoder.block.{layer}", y, target, causal, tr, cross=(encoded, cross_bias))
        self.begin("decoder final norm")
        return tape.dropout(tape.layer_norm(y, batch * target, tr))

    def head_and_loss(self, y: Storage) -> None:
        tape = self.tape
        self.begin("lm head and loss")
        if getattr(self.cfg, "scale_decoder_outputs", self.cfg.tie_word_embeddings):
            y = tape.new(y.numel, y.itemsize, y.rg)  # * d_model**-0.5 (a scalar: nothing saved)
        logits = self.linear("lm_head", y, self.d, self.vocab, self.trainable["embeddings"])
        logits32 = tape.cast(logits, 4)  # losses.token_cross_entropy_sum computes the loss in fp32
        if logits32 is not logits:
            tape.node([], [logits32, logits])
        log_probs = tape.new(logits.numel, 4, logits.rg)
        tape.node([(log_probs, logits.rg)], [log_probs, logits32])  # log_softmax saves its output
        tape.node([(tape.new(self.batch * self.target, 8, False), logits.rg)], [log_probs])  # nll_loss saves labels


def gradient_stage(name: str, stages: list[str], tied: bool) -> int:
    """The stage whose backward creates this parameter's gradient: the last one to use it."""
    block = re.match(r"(encoder|decoder)\.block\.(\d+)\.", name)
    if block:
        return stages.index(f"{block[1]} layer {block[2]}")
    if name.endswith("final_layer_norm.weight"):
        return stages.index(f"{name.split('.')[0]} final norm")
    if name.startswith("lm_head.") or (name == "shared.weight" and tied):
        return stages.index("lm head and loss")
    if name == "shared.weight":
        return stages.index("decoder embedding")
    if name.startswith("prompt_encoder."):  # prompt tuning's soft tokens, before the encoder's input
        return stages.index("encoder embedding")
    raise UsageError(f"unexpected parameter {name}: only T5ForConditionalGeneration layouts are supported")
