"""Linear layers with prepacked weights while sampling on the CPU.

A decoding step multiplies a handful of rows (one per live dialogue) by every weight matrix. For such
short inputs MKL's general matrix product is far from the CPU's peak, and a product against a weight that
MKL has packed once into its own blocked layout is faster (``benchmarks/decode_step.py`` prints the whole
decoding step both ways; docs/benchmarks.md, "Notes"). ``PackedLinears.active(model)`` makes every float32
``nn.Linear`` of the model use such a packed copy for the duration of a block (not LoRA's rank-r A and B, see
``MIN_DIM``):

- the packed copy is made on first use and made again whenever the weight changed (its in-place
  version counter moved, as after an optimizer step), so full fine-tuning stays correct;
- a single row (one dialogue decoding alone), inputs with more than ``MAX_ROWS`` rows (long
  prefills), inputs that need gradients and anything not float32 on the CPU take the ordinary
  ``F.linear``: packing gains nothing there;
- a build of torch without MKL's packed GEMM simply keeps ``F.linear``.

The packed copies stay in memory next to the weights; ``LocalBackend(..., pack_weights=False)`` turns them
off.

The results agree with ``F.linear`` to float32 rounding (the tests compare sampled log-probs with a
teacher-forced forward that does not use this path).
"""
from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F

MAX_ROWS = 128  # above this the packed layout gains nothing (a long prefill is compute-bound either way)
_HINT_ROWS = 32  # the row count MKL is told to pack for; the packed weight serves any row count
# Weights with a side shorter than this (LoRA's rank-r A and B) stay unpacked: their packed buffers are many
# times their size and a rank-16 product costs next to nothing either way (docs/benchmarks.md, "Notes").
MIN_DIM = 64


def available() -> bool:
    try:
        return bool(torch.backends.mkl.is_available()) and hasattr(torch.ops.mkl, "_mkl_linear") \
            and hasattr(torch.ops.mkl, "_mkl_reorder_linear_weight")
    except (AttributeError, RuntimeError):
        return False


class PackedLinears:
    """Packed copies of a model's linear weights, and a context that makes the model use them."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and available()
        self._packs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (ptr, version, packed)

    @contextlib.contextmanager
    def active(self, model):
        if not self.enabled:
            yield model
            return
        mods = [m for m in model.modules() if type(m) is torch.nn.Linear and min(m.weight.shape) >= MIN_DIM
                and m.weight.dtype == torch.float32 and m.weight.device.type == "cpu"]
        for m in mods:
            m.forward = self._forward(m)
        try:
            yield model
        finally:
            for m in mods:
                m.__dict__.pop("forward", None)

    def _packed(self, m):
        w = m.weight
        entry = self._packs.get(m)
        if entry is None or entry[0] != w.data_ptr() or entry[1] != w._version:
            entry = (w.data_ptr(), w._version, torch.ops.mkl._mkl_reorder_linear_weight(w.detach(), _HINT_ROWS))
            self._packs[m] = entry
        return entry

    def _forward(self, m):
        # called some 400 times per decoding step: kept lean (no per-call dictionary lookup or op
        # overload resolution); the packed copy is looked up again only when the weight changed
        w, bias, mkl_linear, cur = m.weight, m.bias, torch.ops.mkl._mkl_linear.default, [None]

        def forward(x):
            rows = x.numel() // x.shape[-1] if x.dim() else 0
            if (rows < 2 or rows > MAX_ROWS or not self.enabled or x.dtype != torch.float32
                    or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
                return F.linear(x, w, bias)
            try:
                entry = cur[0]
                if entry is None or entry[1] != w._version or entry[0] != w.data_ptr():
                    entry = cur[0] = self._packed(m)
                if x.dim() == 2:
                    return mkl_linear(x, entry[2], w, bias, rows)
                return mkl_linear(x.reshape(rows, x.shape[-1]), entry[2], w, bias, rows).reshape(*x.shape[:-1], -1)
            except RuntimeError:  # a build whose MKL cannot do this: stay on the plain path from now on
                self.enabled = False
                return F.linear(x, w, bias)

        return forward
