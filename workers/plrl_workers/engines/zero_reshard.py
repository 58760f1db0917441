"""Load a DeepSpeed ZeRO-1/2 checkpoint's optimizer state at another data-parallel size.

ZeRO-1/2 flatten each parameter group (with alignment padding), cut the flat buffer into one
partition per rank, and each rank writes only its own partition (`zero_pp_rank_<r>_..._optim_states.pt`:
the fp32 master weights, the base optimizer's state of that slice, and `param_slice_mappings`, which
parameter sits where in the slice). DeepSpeed's own loader refuses another DP size; its
alternative, the universal checkpoint (`ds_to_universal`), rewrites the whole state as one file per
parameter and state through worker pools before the load. Here each rank instead reads the saved
partitions in rank order (memory-mapped, so it only pages in what overlaps its own new slice) and
copies every overlap straight into its own partition of fp32 weights, exp_avg, exp_avg_sq...; the
step and hyperparameters are not partitioned and come from rank 0's file. Nothing is written.
`read` checks and re-cuts without touching the engine; `install` puts the result in place once
DeepSpeed has loaded the weights (its weights-only load refreshes the fp32 copy from them).

A parameter's pieces across the saved partitions, in rank order, are its elements in order, so the
running count of elements seen per parameter is where each piece starts inside the parameter.

Neighbours: `engines/deepspeed_engine.py` (decides when: only when the world size changed).
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
from collections.abc import Sequence
from typing import Any

import torch

# Keys of DeepSpeed's ZeRO-1/2 partition file (deepspeed.checkpoint.constants), spelled out so this
# module imports no DeepSpeed at import time.
_OPTIMIZER_STATE_DICT = "optimizer_state_dict"
_BASE_OPTIMIZER_STATE = "base_optimizer_state"
_FP32_PARTITIONS = "single_partition_of_fp32_groups"
_SLICE_MAPPINGS = "param_slice_mappings"
_PARTITION_COUNT = "partition_count"
_GROUP_PADDINGS = "group_paddings"
_PARTITION_FILE = re.compile(r"^(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_00_optim_states\.pt$")


@dataclasses.dataclass(frozen=True)
class Slot:
    """Where this rank holds part of one parameter: `numel` elements from `param_start` of the
    flattened parameter, at `part_start` of the rank's flat partition of group `group`."""

    group: int
    param_start: int
    part_start: int
    numel: int


@dataclasses.dataclass(frozen=True)
class Piece:
    """One saved partition's part of a parameter: `numel` elements at `part_start` of the slice."""

    name: str
    part_start: int
    numel: int


def partition_files(tag_dir: pathlib.Path, where: str, world_size: int) -> list[pathlib.Path]:
    """The saved partition files in rank order; raise unless there is exactly one per saved rank."""
    by_rank: dict[int, pathlib.Path] = {}
    for f in tag_dir.iterdir() if tag_dir.is_dir() else ():
        m = _PARTITION_FILE.match(f.name)
        if m:
            by_rank[int(m.group(1))] = f
    missing = sorted(set(range(world_size)) - set(by_rank))
    if missing or len(by_rank) != world_size:
        raise ValueError(
            f"checkpoint {where}: written by {world_size} ranks, but {tag_dir} holds ZeRO partition "
            f"files for ranks {sorted(by_rank)} (missing {missing}): the optimizer state is incomplete"
        )
    return [by_rank[r] for r in range(world_size)]


def copy_overlaps(
    pieces: Sequence[Piece],
    seen: dict[str, int],
    slots: dict[str, Slot],
    group: int,
    sources: dict[str, torch.Tensor],
    targets: dict[str, torch.Tensor],
) -> None:
    """Copy every piece's overlap with this rank's slots from `sources[key]` (a saved partition)
    into `targets[key]` (this rank's partition); advance `seen` (elements of each parameter met so
    far, over the partitions before this one)."""
    for piece in pieces:
        start = seen[piece.name]
        seen[piece.name] = start + piece.numel
        slot = slots.get(piece.name)
        if slot is None or slot.group != group:
            continue
        lo = max(start, slot.param_start)
        hi = min(start + piece.numel, slot.param_start + slot.numel)
        if lo >= hi:
            continue
        src = piece.part_start + lo - start
        dst = slot.part_start + lo - slot.param_start
        for key, target in targets.items():
            target[dst : dst + hi - lo] = sources[key][src : src + hi - lo]


def _slots(opt: Any) -> tuple[dict[str, Slot], dict[str, int]]:
    """This rank's slots and every parameter's size, from the ZeRO optimizer's own fragment map."""
    slots: dict[str, Slot] = {}
    numels: dict[str, int] = {}
    for g, params in enumerate(opt.bit16_groups):
        for lp in params:
            name = opt.param_names[lp]
            numels[name] = lp.numel()
            frag = lp._hp_mapping
            if frag is not None:
                lp_at, hp_at = frag.lp_fragment_address, frag.hp_fragment_address
                slots[name] = Slot(g, lp_at.start, hp_at.start, hp_at.numel)
    return slots, numels


def _same(a: Any, b: Any) -> bool:
    if torch.is_tensor(a) and torch.is_tensor(b):
        return bool(torch.equal(a, b))
    return bool(a == b)


def _group_state(base: dict[str, Any], g: int) -> dict[str, Any]:
    """The base optimizer's saved state of group `g` (its one flat partition); {} before a step."""
    state: dict[str, Any] = base["state"].get(base["param_groups"][g]["params"][0], {})
    return state


_FP32 = "\0fp32"  # the master weights travel with the optimizer state under a key no optimizer uses


@dataclasses.dataclass
class Recut:
    """This rank's partitions re-cut from a checkpoint, ready to install (`read`, then `install`)."""

    targets: list[dict[str, torch.Tensor]]
    """Per group: the fp32 master weights (`_FP32`) and each partitioned optimizer state."""
    first: dict[str, Any]
    """Saved rank 0's partition file: the unpartitioned state (step), hyperparameters, loss scale."""


def read(opt: Any, files: Sequence[pathlib.Path], where: str) -> Recut:
    """This rank's slices of the fp32 weights and base-optimizer state of the partitions in `files`
    (saved by `len(files)` ranks, in rank order) for `opt` (a DeepSpeedZeroOptimizer, stage 1 or 2).
    Changes nothing, so a checkpoint that does not fit is refused (on every rank alike: all read the
    same files) before anything is loaded."""
    slots, numels = _slots(opt)
    n_groups = len(opt.optimizer.param_groups)
    sizes = [opt.single_partition_of_fp32_groups[g].numel() for g in range(n_groups)]
    targets: list[dict[str, torch.Tensor]] = [{} for _ in range(n_groups)]
    first: dict[str, Any] = {}
    seen = dict.fromkeys(numels, 0)
    for rank, f in enumerate(files):
        sd = torch.load(f, map_location="cpu", weights_only=False, mmap=True)[_OPTIMIZER_STATE_DICT]
        base = sd[_BASE_OPTIMIZER_STATE]
        if sd[_PARTITION_COUNT] != [len(files)] * n_groups or not isinstance(base, dict):
            raise ValueError(
                f"checkpoint {where}: {f.name} was cut into {sd[_PARTITION_COUNT]} partitions per group "
                f"(expected {len(files)} for each of {n_groups} groups, rigid layout): not from this save"
            )
        first = first or sd
        for g in range(n_groups):
            saved, ref = _group_state(base, g), _group_state(first[_BASE_OPTIMIZER_STATE], g)
            size = sd[_FP32_PARTITIONS][g].numel() + sd[_GROUP_PADDINGS][g]
            cut = {k for k, v in saved.items() if torch.is_tensor(v) and v.shape == (size,)}
            if saved.keys() != ref.keys() or any(not _same(saved[k], ref[k]) for k in ref.keys() - cut):
                raise ValueError(
                    f"checkpoint {where}: {f.name} holds optimizer state {sorted(saved)} of group {g} that "
                    f"disagrees with rank 0's {sorted(ref)} (keys or step differ)"
                )
            if rank == 0:
                targets[g] = {k: torch.zeros(sizes[g], dtype=saved[k].dtype) for k in cut}
                targets[g][_FP32] = torch.zeros(sizes[g], dtype=torch.float32)
            pieces = []
            for name, at in sd[_SLICE_MAPPINGS][g].items():
                if name not in numels:
                    raise ValueError(
                        f"checkpoint {where}: {f.name} holds parameter {name!r}, not in this model"
                    )
                pieces.append(Piece(name, at.start, at.numel))
            sources = {k: saved[k] for k in cut} | {_FP32: sd[_FP32_PARTITIONS][g]}
            copy_overlaps(pieces, seen, slots, g, sources, targets[g])
    short = {n: (seen[n], numels[n]) for n in numels if seen[n] != numels[n]}
    if short:
        raise ValueError(
            f"checkpoint {where}: its partitions hold (elements, expected) {short} of these parameters: "
            "a different model or an incomplete save"
        )
    return Recut(targets, first)


def install(opt: Any, recut: Recut) -> None:
    """Collective: put `recut` into `opt` in place of its fp32 weights and optimizer state, then
    refresh the model's weights from the fp32 copy."""
    from deepspeed.utils.mixed_precision_linkage import lazy_init_hp_params_optimizer_state

    # Loss scale and clip value, checked against the DeepSpeed version, as its own loader does.
    opt._load_global_state(recut.first)
    base0 = recut.first[_BASE_OPTIMIZER_STATE]
    for g, group in enumerate(opt.optimizer.param_groups):
        flat, target = opt.single_partition_of_fp32_groups[g], recut.targets[g]
        flat.data.copy_(target[_FP32])
        saved = _group_state(base0, g)
        if saved:
            opt.optimizer.state[flat] = {
                k: (target[k] if k in target else v.clone()).to(flat.device) for k, v in saved.items()
            }
            lazy_init_hp_params_optimizer_state(opt.bit16_groups[g], flat, opt.optimizer.state)
        else:  # written before the first step: Adam creates its state lazily, so none may linger
            opt.optimizer.state.pop(flat, None)
        for k, v in base0["param_groups"][g].items():
            if k != "params":
                group[k] = v
    # Linked above where state exists; otherwise DeepSpeed links it after the first step.
    opt._hp_optimizer_states_linked = bool(opt.optimizer.state)
    opt.update_lp_params()
