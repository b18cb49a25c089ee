"""GPU checks of the patched vLLM on one NVIDIA GPU, from a bundle.

This file is the runner of a bundle made by `scripts/gpu-check --bundle OUT`:

    OUT/gpu_check.py     this file
    OUT/vllm.zip         the patched vllm/ Python sources and its dist-info
    OUT/site/*.whl       the pure-Python packages the imports need
    OUT/manifest.json    what was bundled: versions, series, changed files,
                         vLLM's compiled extensions, the stand-ins allowed

It needs only the Python, torch and Triton of the machine (no vLLM, no network):

    python OUT/gpu_check.py --list
    python OUT/gpu_check.py [--out FILE] [--only NAME ...]

vLLM's module-level imports reach many packages the checks never use
(transformers, pydantic, zmq, ...). Where such a package is not installed, an
inert stand-in takes its place: only the names listed in the manifest, never a
package that is installed, and every stand-in used is listed in the results.
vLLM's compiled extensions are stand-ins too: the checks run Triton and torch
code only. Each check runs in its own subprocess with a timeout; the results
(every check with a status and a reason) go to one JSON file.
"""

from __future__ import annotations

import abc
import argparse
import contextlib
import importlib.abc
import importlib.machinery
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from dataclasses import dataclass, field
from pathlib import Path

BUNDLE = Path(__file__).resolve().parent
TOTAL_BUDGET_S = 480  # the whole run, as the issue asks: at most 8 minutes
# "cpu" only for `--dry-run-cpu`: the checks' own logic under the Triton
# interpreter, without CUDA graphs, timing or symmetric memory.
DEVICE = os.environ.get("GPU_CHECK_DEVICE", "cuda")


@dataclass
class Check:
    name: str
    what: str
    timeout_s: int
    modules: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)


STAGING = "vllm.model_executor.layers.fused_moe.prepare_megamoe"
EPLB_STATE = "vllm.distributed.eplb.eplb_state"
CHECKS = [
    Check(
        "fused-mapping-graph-replay",
        "CUDA-graph replay of MegaMoE staging with the fused EPLB mapping (MXFP8 "
        "and NVFP4): maps and counts updated in place between replays, every "
        "replay maps to the current placement and records the load",
        90,
        (STAGING, EPLB_STATE),
    ),
    Check(
        "staging-fp8-bytes",
        "the staged fp8/fp4 activations and scales are byte-identical with and "
        "without EPLB (MXFP8, BF16 and NVFP4 staging)",
        60,
        (STAGING, EPLB_STATE),
    ),
    Check(
        "index-copy-select-dtypes",
        "index_copy_ / index_select on rows of float8_e4m3fn, float8_e8m0fnu, "
        "int8 and int32 (and their uint8 byte views)",
        30,
    ),
    Check(
        "async-apply-no-sync",
        "the async EPLB apply step (the series' _apply_staged_layer: one byte-view "
        "index_copy_ per weight from the staged slot, then the maps; stock's "
        "_move_to_workspace on a stock tree) under VLLM_GPU_SYNC_CHECK=error",
        90,
        (
            EPLB_STATE,
            "vllm.distributed.eplb.rebalance_execute",
            "vllm.utils.gpu_sync_debug",
        ),
        {"VLLM_GPU_SYNC_CHECK": "error"},
    ),
    Check(
        "symm-mem-two-procs",
        "SymmMemEplbCommunicator with two processes on one GPU: rank 0 pushes "
        "expert rows into rank 1's symmetric buffer (skipped when torch refuses "
        "symmetric memory there)",
        120,
        ("vllm.distributed.eplb.eplb_communicator",),
    ),
    Check(
        "staging-time",
        "MegaMoE staging time with the fused EPLB mapping vs without EPLB, per "
        "rule (CUDA-graph replays; target: within 2 %)",
        90,
        (STAGING, EPLB_STATE),
    ),
]
BY_NAME = {c.name: c for c in CHECKS}


class Skip(Exception):
    """The check cannot run here; the message says why."""


# --- loading vLLM from the bundle ---------------------------------------------


def _decorated(args) -> bool:
    """`deco(fn_or_class, **options)`: a decorator call, which returns its
    argument when `deco` is a stand-in."""
    return len(args) == 1 and isinstance(args[0], type | types.FunctionType)


def _decorate(stand_in: str, target):
    """What a stand-in decorator returns: the target itself, except that a
    stand-in for pydantic's dataclass decorator makes a plain dataclass (vLLM's
    config classes are constructed at import time, with keyword arguments)."""
    if stand_in.endswith("dataclass") and isinstance(target, type):
        import dataclasses

        with contextlib.suppress(TypeError, ValueError):
            return dataclasses.dataclass(target)
    return target


class _StandInMeta(abc.ABCMeta):
    """Metaclass of stand-in classes: any attribute is another stand-in, and
    used as a decorator one returns what it decorates. An ABCMeta, so that a
    class may derive from a stand-in and ABC at once."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{cls.__qualname__}.{name}", cls.__module__)

    def __call__(cls, *args, **kwargs):
        if cls.__dict__.get("_stand_in") and _decorated(args):
            return _decorate(cls.__qualname__, args[0])
        return super().__call__(*args, **kwargs)

    def __getitem__(cls, item):
        return cls

    def __iter__(cls):
        return iter(())

    def __len__(cls):
        return 0


class _StandIn(metaclass=_StandInMeta):
    def __init__(self, *args, **kwargs):
        pass

    def __init_subclass__(cls, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(f"{type(self).__qualname__}.{name}", type(self).__module__)

    def __call__(self, *args, **kwargs):
        if _decorated(args):
            return _decorate(type(self).__qualname__, args[0])
        return _StandIn()

    def __getitem__(self, item):
        return _StandIn()

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0


def _stand_in(qualname: str, module: str) -> type:
    cls = _StandInMeta(qualname.rsplit(".", 1)[-1], (_StandIn,), {"_stand_in": True})
    cls.__qualname__, cls.__module__ = qualname, module
    return cls


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _stand_in(name, self.__name__)


class StandIns(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: provides the allowed packages that no real finder
    found, and records which were used."""

    def __init__(self, tops: set[str], modules: set[str]):
        self.tops, self.modules, self.used = tops, modules, set()

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        if name in self.modules:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        if top not in self.tops:
            return None
        # Reached only when no real finder has the module: a package that is
        # not installed, or a submodule of a stand-in; never a missing
        # submodule of an installed package.
        if name != top and not isinstance(sys.modules.get(top), _StandInModule):
            return None
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        self.used.add(module.__name__.split(".")[0] if module.__name__.split(".")[0]
                      in self.tops else module.__name__)  # fmt: skip


def manifest() -> dict:
    path = BUNDLE / "manifest.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def use_bundle(extra_paths: list[str] = ()) -> StandIns:
    """Put the bundle's vLLM and wheels first on sys.path and install the
    stand-ins; refuse a vLLM from anywhere else."""
    info = manifest()
    wheels = sorted(str(p) for p in (BUNDLE / "site").glob("*.whl"))
    sys.path[:0] = [str(BUNDLE / "vllm.zip"), *wheels, *extra_paths]
    finder = StandIns(set(info.get("stand_ins", ())), set(info.get("extensions", ())))
    sys.meta_path.append(finder)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    return finder


def import_vllm(modules) -> dict:
    import importlib

    loaded = {}
    for name in modules:
        mod = importlib.import_module(name)
        loaded[name] = mod
        origin = getattr(mod, "__file__", "") or ""
        if not origin.startswith(str(BUNDLE / "vllm.zip")):
            raise RuntimeError(f"{name} came from {origin}, not from the bundle")
    return loaded


# --- shared helpers of the checks ------------------------------------------------

# DeepSeek-V3's hidden size and top-k; 64 experts on 80 slots of 8 EP ranks.
# The CPU dry run (Triton interpreter) stages a narrower hidden state.
HIDDEN = 7168 if DEVICE == "cuda" else 256
TOP_K, NUM_LOGICAL, EP_SIZE, SLOTS_PER_RANK = 8, 64, 8, 10
NUM_PHYSICAL = EP_SIZE * SLOTS_PER_RANK  # 80 slots: 16 redundant
KNUTH = 2654435769


def _torch():
    import torch

    if DEVICE == "cuda" and not torch.cuda.is_available():
        raise Skip("no CUDA GPU (torch.cuda.is_available() is False)")
    return torch


def _need_gpu(what: str) -> None:
    if DEVICE != "cuda":
        raise Skip(f"{what} needs a GPU (CPU dry run)")


def _sync() -> None:
    import torch

    if DEVICE == "cuda":
        torch.cuda.synchronize()


def _capture(fn):
    """A CUDA graph of fn, returned as its replay (on the CPU dry run: fn)."""
    import torch

    if DEVICE != "cuda":
        return fn
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def _placement(torch, seed: int):
    """A random placement: physical -> logical over all slots, every logical
    expert at least once; the map padded to width `MAP_WIDTH` as EplbState."""
    gen = torch.Generator().manual_seed(seed)
    extra = torch.randint(0, NUM_LOGICAL, (NUM_PHYSICAL - NUM_LOGICAL,), generator=gen)
    p2l = torch.cat([torch.arange(NUM_LOGICAL), extra])
    p2l = p2l[torch.randperm(NUM_PHYSICAL, generator=gen)]
    width = NUM_PHYSICAL - NUM_LOGICAL + 1
    mapping = torch.full((NUM_LOGICAL, width), -1, dtype=torch.int64)
    counts = torch.zeros(NUM_LOGICAL, dtype=torch.int64)
    for slot, e in enumerate(p2l.tolist()):
        mapping[e, counts[e]] = slot
        counts[e] += 1
    return p2l, mapping, counts


def _rules(mods) -> list[str]:
    triton_mod = sys.modules.get("vllm.model_executor.layers.fused_moe.eplb_triton")
    rules = getattr(triton_mod, "REPLICA_RULES", None)
    return list(rules) if rules else ["hash"]


def _layer_state(mods, torch, mapping, counts, load, num_unpadded, rule, rank):
    state = mods[EPLB_STATE].EplbLayerState()
    state.set_layer_state(0, load[None], mapping[None], counts[None])
    state.should_record_tensor = torch.ones((), dtype=torch.bool, device=DEVICE)
    state.num_unpadded_tokens_tensors = [
        torch.tensor(num_unpadded, dtype=torch.int32, device=DEVICE)
    ]
    fields = getattr(type(state), "__dataclass_fields__", {})
    for name, value in (
        ("replica_selection", rule),
        ("ep_rank", rank),
        ("ep_size", EP_SIZE),
        ("experts_per_rank", SLOTS_PER_RANK),
    ):
        if name in fields:
            setattr(state, name, value)
    return state


def _reference(rule, ids, mapping, counts, rank):
    """Slots each rule picks (the rules of EPLBConfig.replica_selection)."""
    import torch

    valid = ids >= 0
    safe = torch.where(valid, ids, 0)
    rows = torch.arange(ids.shape[0])[:, None].expand_as(ids)
    count = counts[safe]
    hashed = (rows * KNUTH) & 0xFFFFFFFF
    if rule != "hash":
        hashed = hashed + rank
    slot = mapping[safe, hashed % count]
    if rule == "local_first":
        width = int(count.max())
        replicas = mapping[safe][..., :width]
        live = torch.arange(width) < count[..., None]
        local = live & (replicas // SLOTS_PER_RANK == rank)
        first = torch.where(local.any(-1), local.int().argmax(-1), -1)
        mine = replicas.gather(-1, first.clamp(min=0)[..., None])[..., 0]
        slot = torch.where(first >= 0, mine, slot)
    return torch.where(valid, slot, -1)


def _stage_buffers(torch, variant: str, tokens: int) -> dict:
    out = {
        "topk_idx": torch.full((tokens, TOP_K), -7, dtype=torch.int64, device=DEVICE),
        "topk_weights": torch.zeros(tokens, TOP_K, device=DEVICE),
    }
    if variant == "mxfp8":
        out["x"] = torch.empty(tokens, HIDDEN, dtype=torch.float8_e4m3fn, device=DEVICE)
        out["x_sf"] = torch.zeros(
            tokens, HIDDEN // 128, dtype=torch.int32, device=DEVICE
        )
    elif variant == "bf16":
        out["x"] = torch.empty(tokens, HIDDEN, dtype=torch.bfloat16, device=DEVICE)
        out["x_sf"] = None
    else:
        out["x"] = torch.empty(tokens, HIDDEN // 2, dtype=torch.uint8, device=DEVICE)
        out["x_sf"] = torch.zeros(
            tokens, HIDDEN // 64, dtype=torch.int32, device=DEVICE
        )
        out["x_scales"] = torch.zeros(tokens, device=DEVICE)
    return out


def _stage(mods, variant, hidden, weights, ids, is_padding, out, state):
    m = mods[STAGING]
    tail = dict(is_padding=is_padding, eplb_state=state)
    if variant == "nvfp4":
        m.prepare_megamoe_nvfp4_inputs(
            hidden, weights, ids, out["x"], out["x_sf"], out["x_scales"],
            out["topk_idx"], out["topk_weights"], **tail,
        )  # fmt: skip
    else:
        m.prepare_megamoe_inputs(
            hidden, weights, ids, out["x"], out["x_sf"], out["topk_idx"],
            out["topk_weights"], hidden_quant=None if variant == "bf16" else
            sys.modules["vllm.model_executor.layers.quantization.utils.quant_utils"]
            .kMxfp8Dynamic, **tail,
        )  # fmt: skip


def _inputs(torch, tokens: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, HIDDEN, generator=gen).to(torch.bfloat16)
    weights = torch.rand(tokens, TOP_K, generator=gen)
    ids = torch.randint(
        0, NUM_LOGICAL, (tokens, TOP_K), generator=gen, dtype=torch.int32
    )
    is_padding = torch.zeros(tokens, dtype=torch.bool)
    is_padding[-3:] = True
    return [t.to(DEVICE) for t in (hidden, weights, ids, is_padding)]


# --- the checks --------------------------------------------------------------------


def check_fused_mapping_graph_replay(mods) -> dict:
    torch = _torch()
    details = {}
    rank = 3
    for variant, tokens in (("mxfp8", 64), ("nvfp4", 40)):
        for rule in _rules(mods):
            hidden, weights, ids, is_padding = _inputs(torch, tokens, seed=1)
            p2l, mapping, counts = _placement(torch, seed=2)
            mapping_d, counts_d = mapping.to(DEVICE), counts.to(DEVICE)
            load = torch.zeros(NUM_PHYSICAL, dtype=torch.int32, device=DEVICE)
            unpadded = tokens - 3
            state = _layer_state(
                mods, torch, mapping_d, counts_d, load, unpadded, rule, rank
            )
            out = _stage_buffers(torch, variant, tokens)
            args = (mods, variant, hidden, weights, ids, is_padding, out, state)
            _stage(*args)  # compile outside the capture
            _sync()
            replay = _capture(lambda args=args: _stage(*args))
            replays = []
            for step, seed in enumerate((2, 3, 4)):
                p2l, mapping, counts = _placement(torch, seed)
                mapping_d.copy_(mapping)  # in place: the graph keeps the pointers
                counts_d.copy_(counts)
                load.zero_()
                out["topk_idx"].fill_(-7)
                replay()
                _sync()
                chosen = out["topk_idx"].cpu()
                routed = ~is_padding.cpu()[:, None].expand(-1, TOP_K)
                ids_c = ids.cpu().long()
                problems = []
                if not torch.all(chosen[~routed] == -1):
                    problems.append("padded rows routed")
                if not torch.equal(p2l[chosen[routed]], ids_c[routed]):
                    problems.append("a slot does not hold the requested expert")
                want = torch.bincount(
                    chosen[:unpadded][routed[:unpadded]], minlength=NUM_PHYSICAL
                )
                if not torch.equal(load.cpu().long(), want):
                    problems.append("recorded load != bincount of chosen slots")
                if rule in ("hash", "rank_hash", "local_first"):
                    ref = _reference(
                        rule, torch.where(routed, ids_c, -1), mapping, counts, rank
                    )
                    if not torch.equal(chosen, ref):
                        problems.append(f"differs from the {rule} reference")
                replays.append({"placement": step, "problems": problems})
            details[f"{variant}/{rule}"] = replays
    bad = {k: r for k, r in details.items() if any(x["problems"] for x in r)}
    if bad:
        raise AssertionError(f"stale or wrong mapping after replays: {bad}")
    return details


def check_staging_fp8_bytes(mods) -> dict:
    torch = _torch()
    details = {}
    for variant in ("mxfp8", "bf16", "nvfp4"):
        hidden, weights, ids, is_padding = _inputs(torch, 96, seed=5)
        _, mapping, counts = _placement(torch, seed=6)
        load = torch.zeros(NUM_PHYSICAL, dtype=torch.int32, device=DEVICE)
        state = _layer_state(
            mods, torch, mapping.to(DEVICE), counts.to(DEVICE), load, 93, "hash", 0
        )
        plain = _stage_buffers(torch, variant, 96)
        mapped = _stage_buffers(torch, variant, 96)
        _stage(mods, variant, hidden, weights, ids, is_padding, plain, None)
        _stage(mods, variant, hidden, weights, ids, is_padding, mapped, state)
        _sync()
        same = {}
        for name in ("x", "x_sf", "x_scales"):
            if plain.get(name) is None:
                continue
            a, b = plain[name].view(torch.uint8), mapped[name].view(torch.uint8)
            same[name] = bool(torch.equal(a, b))
        details[variant] = {
            "identical": same,
            "bytes": {
                k: plain[k].numel() * plain[k].element_size() for k in same
            },  # fmt: skip
            "ids_mapped": not torch.equal(plain["topk_idx"], mapped["topk_idx"]),
        }
        if not all(same.values()) or not details[variant]["ids_mapped"]:
            raise AssertionError(f"{variant}: {details[variant]}")
    return details


def check_index_copy_select_dtypes(mods) -> dict:
    torch = _torch()
    details = {}
    failures = []
    for name in ("float8_e4m3fn", "float8_e8m0fnu", "int8", "int32"):
        dtype = getattr(torch, name, None)
        if dtype is None:
            details[name] = f"skipped: torch {torch.__version__} has no {name}"
            continue
        rows, width = 48, 1024
        raw = torch.randint(0, 255, (rows, width * torch.empty((), dtype=dtype)
                                     .element_size()), dtype=torch.uint8)  # fmt: skip
        if dtype == torch.float8_e8m0fnu:
            raw[raw == 255] = 0  # 0xFF is e8m0's NaN
        src = raw.view(dtype).to(DEVICE)
        idx = torch.randperm(rows)[:20].to(DEVICE)
        result = {}
        for how, view in (
            ("native", lambda t: t),
            ("uint8 view", lambda t: t.view(torch.uint8)),
        ):
            try:
                dst = torch.zeros_like(src)
                view(dst).index_copy_(0, idx, view(src).index_select(0, idx))
                got = dst.view(torch.uint8).cpu()
                want = torch.zeros_like(raw)
                want[idx.cpu()] = raw[idx.cpu()]
                result[how] = "ok" if torch.equal(got, want) else "wrong bytes"
            except Exception as e:  # the finding: which dtypes torch lacks
                result[how] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
        details[name] = result
        if result["uint8 view"] != "ok" or result["native"] == "wrong bytes":
            failures.append(name)
    if failures:
        raise AssertionError(
            f"index_copy_/index_select broken for {failures}: {details}"
        )
    return details


class _LocalOnly:
    """Communicator for one rank: every row moves locally, nothing is sent."""

    needs_recv_rows = False
    needs_profile_buffer_reservation = False
    owned_expert_buffer = None

    def set_transfer_context(self, *args, **kwargs):
        pass

    def add_send(self, *args, **kwargs):
        raise AssertionError("one rank sends nothing")

    add_recv = add_send

    def execute(self):
        pass


def check_async_apply_no_sync(mods) -> dict:
    torch = _torch()
    from types import SimpleNamespace

    eplb_state = mods[EPLB_STATE]
    rebalance = sys.modules["vllm.distributed.eplb.rebalance_execute"]
    sync_debug = sys.modules["vllm.utils.gpu_sync_debug"]
    armed = getattr(sync_debug, "_SYNC_CHECK_MODE", None) == "error"
    if DEVICE == "cuda" and not armed:
        raise Skip(
            "vLLM's GPU sync check is not armed (VLLM_GPU_SYNC_CHECK=error on a "
            "CUDA platform); platform: "
            f"{type(sys.modules['vllm.platforms'].current_platform).__name__}"
        )
    layers, rows, width = 2, NUM_PHYSICAL, 512
    old_p2l, _, _ = _placement(torch, seed=7)
    new_p2l, _, _ = _placement(torch, seed=8)
    # Rows of expert e hold e in every element, so the result is checkable.
    weights = [[old_p2l[:, None].repeat(1, width).to(torch.int32).to(DEVICE),
                old_p2l[:, None].repeat(1, 2 * width).to(torch.float8_e4m3fn).to(DEVICE)]
               for _ in range(layers)]  # fmt: skip
    buffers = [torch.empty_like(w) for w in weights[0]]
    stream = torch.cuda.Stream() if DEVICE == "cuda" else None
    # Worker side (its own thread and stream in vLLM; not sync-checked there).
    metadata = rebalance.move_to_buffer(
        num_local_experts=rows, old_indices=old_p2l.numpy(),
        new_indices=new_p2l.numpy(), expert_weights=weights[1],
        expert_weights_buffers=buffers, stream=stream, ep_rank=0,
        communicator=_LocalOnly(), layer_idx=1,
    )  # fmt: skip
    _sync()
    p2l = old_p2l[None].repeat(layers, 1).to(DEVICE)
    l2p = torch.full((layers, NUM_LOGICAL, NUM_PHYSICAL - NUM_LOGICAL + 1), -1,
                     dtype=torch.int64, device=DEVICE)  # fmt: skip
    counts = torch.zeros(layers, NUM_LOGICAL, dtype=torch.int64, device=DEVICE)
    # The worker waits on this event; CPU tensors have no device events.
    event = (
        eplb_state.CpuGpuEvent()
        if DEVICE == "cuda"
        else SimpleNamespace(record=lambda stream=None: None)
    )
    staged = hasattr(eplb_state, "_apply_staged_layer")
    slot_fields = {}
    if staged:
        # Worker side of the series: compact the changed rows in place and
        # stage the new maps, as the async worker does before publishing.
        dst, src = rebalance.staged_rows(metadata, new_p2l.numpy(), 0)
        rebalance.compact_staged_rows(buffers, buffers, dst, src)
        new_l2p, new_counts = eplb_state.compute_logical_maps(new_p2l, NUM_LOGICAL)
        slot_l2p = torch.full_like(l2p[0], -1)
        slot_l2p[:, : new_l2p.shape[-1]] = new_l2p.to(DEVICE)
        slot = rebalance.AsyncStagingSlot(
            buffers=buffers,
            rows=torch.from_numpy(dst).to(DEVICE),
            physical_to_logical_map=new_p2l.to(DEVICE),
            logical_to_physical_map=slot_l2p,
            logical_replica_count=new_counts.to(DEVICE),
            consumed_event=event,
        )
        slot_fields = {"slot": slot, "num_rows": len(dst)}
        _sync()
    result = rebalance.AsyncEplbLayerResult(
        layer_idx=1, new_physical_to_logical_map=new_p2l.clone(),
        transfer_metadata=metadata, consumed_event=event, **slot_fields,
    )  # fmt: skip
    model_state = SimpleNamespace(
        pending_result=result, expert_buffer=buffers, rebalanced=True,
        model=SimpleNamespace(expert_weights=weights, num_moe_layers=layers),
        physical_to_logical_map=p2l, logical_to_physical_map=l2p,
        logical_replica_count=counts,
    )  # fmt: skip

    def decode_step():
        if staged:
            eplb_state._apply_staged_layer(model_state, result)
        else:
            eplb_state._move_to_workspace(model_state, 0)

    if armed:
        decode_step = sync_debug.with_gpu_sync_check(decode_step)
        sync_debug.enable_gpu_sync_check()
    _sync()
    decode_step()  # with the check armed, raises on a GPU<->CPU sync
    _sync()
    want = new_p2l[:, None].to(torch.int32)
    ok_weights = torch.equal(weights[1][0].cpu(), want.repeat(1, width))
    ok_p2l = torch.equal(p2l[1].cpu(), new_p2l)
    ok_counts = torch.equal(
        counts[1].cpu(), torch.bincount(new_p2l, minlength=NUM_LOGICAL)
    )
    ok_l2p = not staged or torch.equal(l2p[1].cpu(), slot_l2p.cpu())
    if not (ok_weights and ok_p2l and ok_counts and ok_l2p):
        raise AssertionError(
            f"weights {ok_weights}, p2l {ok_p2l}, counts {ok_counts}, l2p {ok_l2p}"
        )
    patches = manifest().get("source", {}).get("patches", [])
    async_patches = [p for p in patches if "async" in p]
    return {
        "sync_check": "error" if armed else "not armed (CPU dry run)",
        "apply": "_apply_staged_layer" if staged else "_move_to_workspace",
        "path": f"the series' async patch {async_patches}"
        if async_patches
        else "no async patch in the series: stock async apply path (baseline)",
    }


def _symm_mem_rank(rank: int, store_dir: str, conn) -> None:
    try:
        use_bundle(json.loads(os.environ["GPU_CHECK_EXTRA_PATHS"]))
        from types import SimpleNamespace
        from unittest import mock

        import torch
        import torch.distributed as dist

        mods = import_vllm(("vllm.distributed.eplb.eplb_communicator",))
        comm_mod = mods["vllm.distributed.eplb.eplb_communicator"]
        torch.cuda.set_device(0)
        store = dist.FileStore(os.path.join(store_dir, "store"), 2)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2)
        group = dist.group.WORLD

        def all_reduce(t):
            dist.all_reduce(t, group=group)
            return t

        coord = SimpleNamespace(device_group=group, cpu_group=group,
                                cpu_all_reduce_=all_reduce, cpu_timeout=None)  # fmt: skip
        layer = [torch.full((4, 256), 10 + rank, dtype=torch.int32, device=DEVICE)]
        platform_ = comm_mod.current_platform
        with mock.patch.object(platform_, "is_fully_connected", lambda ids: True):
            comm = comm_mod.SymmMemEplbCommunicator(coord, layer)
        recv_rows = [{}, {7: 2}]  # rank 1 receives expert 7 into buffer row 2
        comm.set_transfer_context(None, 0, recv_rows)
        if rank == 0:
            comm.add_send([layer[0][1]], 1, 7)
        else:
            comm.add_recv([comm.owned_expert_buffer[0][2]], 0, 7)
        comm.execute()
        torch.cuda.synchronize()
        got = comm.owned_expert_buffer[0][2].cpu() if rank == 1 else None
        ok = rank == 0 or bool(torch.all(got == 10))
        dist.barrier()
        conn.send({"ok": ok})
    except Exception as e:
        conn.send(
            {"error": f"{type(e).__name__}: {e}", "tb": traceback.format_exc()[-2000:]}
        )


def check_symm_mem_two_procs(mods) -> dict:
    torch = _torch()
    _need_gpu("symmetric memory")
    import multiprocessing as mp

    comm_mod = mods["vllm.distributed.eplb.eplb_communicator"]
    if not hasattr(comm_mod, "SymmMemEplbCommunicator"):
        raise Skip("this vLLM has no SymmMemEplbCommunicator")
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except Exception as e:
        raise Skip(f"torch {torch.__version__} has no symmetric memory: {e}") from e
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        pipes = [ctx.Pipe(duplex=False) for _ in range(2)]
        procs = [ctx.Process(target=_symm_mem_rank, args=(r, tmp, pipes[r][1]))
                 for r in range(2)]  # fmt: skip
        for p in procs:
            p.start()
        results = []
        for reader, _ in pipes:
            results.append(reader.recv() if reader.poll(100) else
                           {"error": "no answer within 100 s"})  # fmt: skip
        for p in procs:
            p.join(10)
            if p.is_alive():
                p.kill()
    errors = [r for r in results if "error" in r]
    if errors:
        text = errors[0]["error"]
        if re.search(r"symmetric|multicast|IPC|not supported|CUDA driver", text, re.I):
            raise Skip(f"torch refuses symmetric memory for two processes on one "
                       f"GPU: {text[:400]}")  # fmt: skip
        raise AssertionError(f"{errors}")
    if not all(r["ok"] for r in results):
        raise AssertionError(
            f"rank 1's buffer row did not receive rank 0's row: {results}"
        )
    return {"ranks": 2, "rows_pushed": 1}


def check_staging_time(mods) -> dict:
    torch = _torch()
    _need_gpu("timing")
    details = {}
    for variant, tokens in (("mxfp8", 256), ("nvfp4", 256)):
        hidden, weights, ids, is_padding = _inputs(torch, tokens, seed=9)
        _, mapping, counts = _placement(torch, seed=10)
        times = {}
        for rule in ["off", *_rules(mods)]:
            load = torch.zeros(NUM_PHYSICAL, dtype=torch.int32, device=DEVICE)
            state = (
                None
                if rule == "off"
                else _layer_state(
                    mods,
                    torch,
                    mapping.to(DEVICE),
                    counts.to(DEVICE),
                    load,
                    tokens,
                    rule,
                    3,
                )
            )
            out = _stage_buffers(torch, variant, tokens)
            args = (mods, variant, hidden, weights, ids, is_padding, out, state)
            _stage(*args)
            replay = _capture(lambda args=args: [_stage(*args) for _ in range(20)])
            samples = []
            for _ in range(30):
                start = torch.cuda.Event(enable_timing=True)
                end = torch.cuda.Event(enable_timing=True)
                start.record()
                replay()
                end.record()
                end.synchronize()
                samples.append(start.elapsed_time(end) * 1000 / 20)
            times[rule] = statistics.median(samples)
        base = times.pop("off")
        details[variant] = {
            "us_without_eplb": round(base, 2),
            "us_with_fused_mapping": {r: round(t, 2) for r, t in times.items()},
            "ratio": {r: round(t / base, 4) for r, t in times.items()},
        }
    ratios = [r for v in details.values() for r in v["ratio"].values()]
    details["target"] = "fused mapping within 2 % of staging without EPLB"
    details["target_met"] = all(r <= 1.02 for r in ratios)
    return details


RUNNERS = {
    "fused-mapping-graph-replay": check_fused_mapping_graph_replay,
    "staging-fp8-bytes": check_staging_fp8_bytes,
    "index-copy-select-dtypes": check_index_copy_select_dtypes,
    "async-apply-no-sync": check_async_apply_no_sync,
    "symm-mem-two-procs": check_symm_mem_two_procs,
    "staging-time": check_staging_time,
}


# --- running -------------------------------------------------------------------------


def run_one(name: str, extra_paths: list[str]) -> dict:
    """Run one check in this process (the --one mode); returns its record."""
    check = BY_NAME[name]
    start = time.perf_counter()
    record = {"status": "pass", "reason": None, "details": None}
    finder = None
    try:
        _torch()
        finder = use_bundle(extra_paths)
        os.environ["GPU_CHECK_EXTRA_PATHS"] = json.dumps(list(extra_paths))
        mods = import_vllm(check.modules)
        record["details"] = RUNNERS[name](mods)
    except Skip as e:
        record.update(status="skip", reason=str(e))
    except AssertionError as e:
        record.update(status="fail", reason=str(e)[:4000])
    except Exception as e:
        record.update(status="error", reason=f"{type(e).__name__}: {e}"[:2000],
                      traceback=traceback.format_exc()[-4000:])  # fmt: skip
    record["seconds"] = round(time.perf_counter() - start, 2)
    record["stand_ins"] = sorted(finder.used) if finder else []
    return record


def import_check(extra_paths: list[str]) -> dict:
    """Import every vLLM module the checks need, from the bundle only."""
    finder = use_bundle(extra_paths)
    needed = sorted({m for c in CHECKS for m in c.modules})
    mods = import_vllm(needed)
    import vllm

    return {
        "vllm": getattr(vllm, "__version__", "?"),
        "vllm_file": vllm.__file__,
        "modules": {n: m.__file__ for n, m in mods.items()},
        "stand_ins": sorted(finder.used),
    }


def _python() -> list[str]:
    """This interpreter with its isolation flags, for the child processes."""
    return [sys.executable, *(["-I"] if sys.flags.isolated else []),
            *(["-S"] if sys.flags.no_site else [])]  # fmt: skip


def gpu_name() -> str:
    try:
        import torch

        if torch.cuda.is_available():
            name = torch.cuda.get_device_name(0)
            return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    except Exception:
        pass
    return "no-gpu"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--list", action="store_true", help="print the checks and exit")
    ap.add_argument("--only", nargs="*", default=None, help="run these checks only")
    ap.add_argument("--out", type=Path, help="results JSON (default: "
                    "<bundle>/results/gpu-check-<gpu>.json)")  # fmt: skip
    ap.add_argument("--site", action="append", default=[],
                    help="extra sys.path entries (e.g. a torch-only folder)")  # fmt: skip
    ap.add_argument("--one", help=argparse.SUPPRESS)
    ap.add_argument("--import-check", action="store_true",
                    help="import the vLLM modules of every check and print where from")  # fmt: skip
    ap.add_argument("--dry-run-cpu", action="store_true",
                    help="run the checks' logic on CPU under the Triton interpreter "
                    "(no graphs, timing or symmetric memory): tests the runner")  # fmt: skip
    args = ap.parse_args(argv)
    sys.path[:0] = args.site

    if args.list:
        for c in CHECKS:
            print(f"{c.name:28s} {c.what} (timeout {c.timeout_s} s)")
        return 0
    if args.one:
        print(json.dumps(run_one(args.one, args.site)))
        return 0
    if args.import_check:
        print(json.dumps(import_check(args.site), indent=1))
        return 0

    names = args.only or [c.name for c in CHECKS]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown checks {unknown}; --list shows them")
    child_env = dict(os.environ)
    if args.dry_run_cpu:
        child_env.update(GPU_CHECK_DEVICE="cpu", TRITON_INTERPRET="1",
                         CUDA_VISIBLE_DEVICES="", VLLM_TARGET_DEVICE="cpu")  # fmt: skip
    env_info = {"python": platform.python_version(), "machine": platform.node()}
    with contextlib.suppress(Exception):
        import torch
        import triton

        env_info.update(torch=torch.__version__, triton=triton.__version__,
                        cuda=torch.version.cuda)  # fmt: skip
        if torch.cuda.is_available():
            env_info["gpu"] = torch.cuda.get_device_name(0)
            env_info["capability"] = list(torch.cuda.get_device_capability(0))
    results = {"bundle": manifest().get("source", {}), "environment": env_info,
               "dry_run_cpu": args.dry_run_cpu, "imports": None, "checks": {}}  # fmt: skip
    deadline = time.monotonic() + TOTAL_BUDGET_S
    site_args = [f"--site={s}" for s in args.site]
    # The bundle's vLLM must import here, GPU or not.
    proc = subprocess.run(
        [*_python(), str(Path(__file__).resolve()), "--import-check", *site_args],
        env=child_env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    if proc.returncode == 0:
        results["imports"] = {"status": "pass", **json.loads(proc.stdout)}
    else:
        results["imports"] = {"status": "error", "reason": proc.stderr.strip()[-3000:]}
    print(f"gpu-check: imports from the bundle: {results['imports']['status']}",
          file=sys.stderr, flush=True)  # fmt: skip
    for name in names:
        check = BY_NAME[name]
        left = deadline - time.monotonic()
        if left < 10:
            results["checks"][name] = {
                "status": "skip",
                "reason": "8-minute budget spent",
            }
            continue
        env = {**child_env, **check.env}
        cmd = [*_python(), str(Path(__file__).resolve()), "--one", name, *site_args]
        print(f"gpu-check: {name} ...", file=sys.stderr, flush=True)
        try:
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                  timeout=min(check.timeout_s, left))  # fmt: skip
            lines = proc.stdout.strip().splitlines()
            record = (
                json.loads(lines[-1])
                if proc.returncode == 0 and lines
                else {
                    "status": "error",
                    "reason": f"exit {proc.returncode}: {proc.stderr.strip()[-2000:]}",
                }
            )
        except subprocess.TimeoutExpired:
            record = {
                "status": "timeout",
                "reason": f"no result within {check.timeout_s} s",
            }
        results["checks"][name] = record
        print(f"gpu-check: {name}: {record['status']}"
              + (f" ({record['reason'][:160]})" if record.get("reason") else ""),
              file=sys.stderr, flush=True)  # fmt: skip
    out = args.out or BUNDLE / "results" / f"gpu-check-{gpu_name()}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n")
    print(f"gpu-check: results in {out}", file=sys.stderr)
    bad = ("fail", "error", "timeout")
    failed = [n for n, r in results["checks"].items() if r["status"] in bad]
    return 1 if failed or results["imports"]["status"] != "pass" else 0


if __name__ == "__main__":
    sys.exit(main())
