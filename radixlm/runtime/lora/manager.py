"""The adapters a model runner holds: which are registered, which are resident in the stacks
the forward reads, and the hooks that add their low-rank updates to the base projections.

NOTE: LoRA is a transform on the plain model: forward hooks on its projections, buffers kept
here (the model's own parameters, names and compiled steps are untouched). A forward whose
batch has no adapter rows (``active`` None) runs the base model as before; one with them runs
eagerly."""

from __future__ import annotations

import itertools
import logging
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from radixlm.runtime.executor.forward_batch import ForwardBatch
from radixlm.runtime.lora.adapter import LoraWeights, TargetShape, read_adapter
from radixlm.runtime.lora.batched import (
    Segment,
    add_lora,
    add_lora_masked,
    column_mask,
    segments,
)
from radixlm.runtime.models.layers import Attention, GatedMLP

MASKED_MAX_ROWS = 64  # NOTE: up to this many rows the masked form's fewer ops win (bench_lora)

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AdapterRef:
    """A registered adapter. ``key`` is unique per registration (a name loaded again from
    another path gets a new one), so cached KV of the old one is never reused."""

    name: str
    path: str
    key: str


class LoraStack:
    """The stacked A and B of one projection for every slot: ``a [S*W, in]``, ``b [out, S*W]``,
    ``W = shards * max_rank`` columns per slot (shard j's at ``j * max_rank``)."""

    def __init__(self, shape: TargetShape, slots: int, max_rank: int, dtype, device) -> None:
        self.shape, self.rank = shape, max_rank
        self.width = len(shape.shards) * max_rank
        self.a = torch.zeros(slots * self.width, shape.in_features, dtype=dtype, device=device)
        self.b = torch.zeros(shape.out_features, slots * self.width, dtype=dtype, device=device)

    def write(self, slot: int, pairs: list) -> None:
        cols = slice(slot * self.width, (slot + 1) * self.width)
        self.a[cols] = 0
        self.b[:, cols] = 0
        for pair in pairs:
            shard = max(pair.shard, 0)
            c = cols.start + shard * self.rank
            r = pair.a.shape[0]
            start = sum(self.shape.shards[:shard]) if pair.shard >= 0 else 0
            self.a[c : c + r] = pair.a.to(self.a.dtype)
            self.b[start : start + pair.b.shape[0], c : c + r] = pair.b.to(self.b.dtype)


class LoraRows:
    """The rows of one forward by adapter slot: as segments, and (for the masked form) each
    row's slot relative to the lowest present one, with its masks by width."""

    def __init__(self, slots: list[int], lengths: list[int], device) -> None:
        self.num_rows = sum(lengths)
        self.groups: list[Segment] = segments(slots, lengths, device)
        present = [g.slot for g in self.groups]
        self.lo, self.hi = min(present), max(present)
        per_row = [s - self.lo if s >= 0 else -1 for s, n in zip(slots, lengths) for _ in range(n)]
        self._row_slots = torch.tensor(per_row, dtype=torch.int64, device=device)
        self._masks: dict[tuple[int, torch.dtype], torch.Tensor] = {}

    def mask(self, width: int, dtype: torch.dtype) -> torch.Tensor:
        key = (width, dtype)
        if key not in self._masks:
            span = self.hi - self.lo + 1
            self._masks[key] = column_mask(self._row_slots, span, width, dtype)
        return self._masks[key]


def lora_targets(model: nn.Module) -> dict[str, tuple[nn.Module, TargetShape]]:
    """Our projections LoRA may adapt, by module name, with their shapes: every attention's
    q/k/v and o, every dense MLP's gate/up and down (a mixture-of-experts layer's experts are
    not targets)."""
    c = model.config
    found = {}
    for name, m in model.named_modules():
        if isinstance(m, Attention):
            found[f"{name}.qkv_proj"] = m.qkv_proj, TargetShape(c.hidden_size, m.sizes)
            found[f"{name}.o_proj"] = m.o_proj, TargetShape(m.sizes[0], (c.hidden_size,))
        elif isinstance(m, GatedMLP):
            inter = c.intermediate_size
            found[f"{name}.gate_up_proj"] = m.gate_up_proj, TargetShape(c.hidden_size, (inter,) * 2)
            found[f"{name}.down_proj"] = m.down_proj, TargetShape(inter, (c.hidden_size,))
    return found


class LoraManager:
    """Registered adapters by name, up to ``max_loras`` of them resident (least recently used
    idle ones evicted to make room, read again from their directory when next needed)."""

    def __init__(self, model: nn.Module, max_loras: int, max_rank: int, dtype, device) -> None:
        self.model, self.max_loras, self.max_rank = model, max_loras, max_rank
        targets = lora_targets(model)
        self.shapes = {name: shape for name, (_, shape) in targets.items()}
        self.stacks = {
            name: LoraStack(shape, max_loras, max_rank, dtype, device)
            for name, shape in self.shapes.items()
        }
        self.registry: dict[str, AdapterRef] = {}
        self.slots: list[AdapterRef | None] = [None] * max_loras
        self.last_used = [0] * max_loras
        self.loads = 0  # adapters read into a slot (registrations and reloads after eviction)
        self._clock = itertools.count(1)
        self._ids = itertools.count()
        self.active: LoraRows | None = None  # the running forward's rows by slot
        for name, (module, _) in targets.items():
            module.register_forward_hook(self._hook(self.stacks[name]))

    # -- registry ------------------------------------------------------------------------------

    def register(self, name: str, path: str, in_use: set[str] = frozenset()) -> AdapterRef:
        """Read and check the adapter (ValueError naming the problem) and register it; it is
        made resident now if a slot is free or idle."""
        if not name or not isinstance(name, str):
            raise ValueError("lora_name must be a non-empty string")
        if name in self.registry:
            raise ValueError(f"LoRA adapter {name!r} is already loaded; unload it first")
        weights = self._read(name, path)
        ref = AdapterRef(name, path, f"{name}#{next(self._ids)}")
        self.registry[name] = ref
        slot = self._free_slot(in_use)
        if slot is not None:
            self._place(ref, weights, slot)
        logger.info("LoRA adapter %r loaded from %s (rank %d)", name, path, weights.rank)
        return ref

    def unregister(self, name: str) -> None:
        """New requests can no longer name it; requests already holding it finish with it."""
        if self.registry.pop(name, None) is None:
            raise ValueError(f"LoRA adapter {name!r} is not loaded")
        logger.info("LoRA adapter %r unloaded", name)

    @property
    def paths(self) -> dict[str, str]:
        """Every registered adapter's directory, by name."""
        return {name: ref.path for name, ref in sorted(self.registry.items())}

    # -- residency -------------------------------------------------------------------------------

    def slot_of(self, ref: AdapterRef) -> int | None:
        return next((i for i, held in enumerate(self.slots) if held == ref), None)

    def ensure(self, ref: AdapterRef, in_use: set[str]) -> bool:
        """Make ``ref`` resident (evicting the least recently used adapter no request in
        ``in_use`` holds); False when every slot is in use. ValueError if its directory can no
        longer be read."""
        slot = self.slot_of(ref)
        if slot is None:
            slot = self._free_slot(in_use)
            if slot is None:
                return False
            self._place(ref, self._read(ref.name, ref.path), slot)
        self.last_used[slot] = next(self._clock)
        return True

    def _free_slot(self, in_use: set[str]) -> int | None:
        idle = [i for i, held in enumerate(self.slots) if held is None or held.key not in in_use]
        if not idle:
            return None
        return min(idle, key=lambda i: (self.slots[i] is not None, self.last_used[i]))

    def _read(self, name: str, path: str) -> LoraWeights:
        return read_adapter(name, path, self.model, self.shapes, self.max_rank)

    def _place(self, ref: AdapterRef, weights: LoraWeights, slot: int) -> None:
        with torch.no_grad():
            for name, stack in self.stacks.items():
                stack.write(slot, weights.pairs.get(name, []))
        self.slots[slot], self.last_used[slot] = ref, next(self._clock)
        self.loads += 1

    # -- forward ---------------------------------------------------------------------------------

    @contextmanager
    def activate(self, batch: ForwardBatch):
        """Run the forward inside with each token row adapted by its request's slot."""
        self.active = LoraRows(batch.lora_slots, batch.extend_lens_list, batch.input_ids.device)
        try:
            yield
        finally:
            self.active = None

    def _hook(self, stack: LoraStack):
        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor | None:
            rows = self.active
            if rows is None:
                return None
            x, w = inputs[0], stack.width
            if rows.num_rows > MASKED_MAX_ROWS:
                return add_lora(output, x, stack.a, stack.b, w, rows.groups)
            cols = slice(rows.lo * w, (rows.hi + 1) * w)  # NOTE: the present slots' range only
            mask = rows.mask(w, x.dtype)
            return add_lora_masked(output, x, stack.a[cols], stack.b[:, cols], mask)

        return hook

    def describe(self) -> dict:
        return {
            "adapters": self.paths,
            "resident": [ref.name if ref else None for ref in self.slots],
            "max_loras": self.max_loras,
            "max_lora_rank": self.max_rank,
            "loads": self.loads,
        }
