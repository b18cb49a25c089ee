"""Drivers for the AOT compile tests: each one calls a vLLM launch wrapper the way
vLLM's forward pass does, with small CPU tensors, once per variant.

Nothing here names a Triton kernel or writes a signature: the worker
(aot_worker.py) intercepts the launches the wrappers make and compiles exactly
what they would have launched. A driver only knows its wrapper's inputs, and it
adapts to the API the imported vLLM has (stock or patched), so one driver serves
both sides of the stock-vs-patched comparison.

A variant is a dict of axis -> value. The "eplb" axis is "off" or a replica rule;
every other axis exists on both sides. `stock_key()` maps a patched variant to
the stock variant it is compared with.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import itertools
import typing
from collections.abc import Callable
from types import SimpleNamespace
from unittest import mock

# A DeepSeek-V3-class layer on DEP8: 256 routed experts, 32 redundant slots,
# hidden 7168, top-8. Shapes are constexprs of the staging kernels, so they are
# the production ones; the tensors stay small (at most 1024 tokens).
HIDDEN = 7168
TOP_K = 8
NUM_LOGICAL = 256
NUM_REDUNDANT = 32
EP_SIZE = 8
NUM_PHYSICAL = NUM_LOGICAL + NUM_REDUNDANT
SHARED_BLOCK_M = 128
# Map widths EplbState allocates: R + 1 slots, or 1024 with elastic EP.
MAP_WIDTHS = {"R+1": NUM_REDUNDANT + 1, "elastic": 1024}

AXIS_ORDER = ("quant", "shared", "padding", "tokens", "ids", "eplb", "rank", "map")


def variant_key(variant: dict) -> str:
    return " ".join(f"{k}={variant[k]}" for k in AXIS_ORDER if k in variant)


def stock_key(variant: dict) -> str:
    """The stock variant a patched one is compared with: the same launch with
    the stock replica rule ("hash") when EPLB is on."""
    if variant.get("eplb", "off") != "off":
        variant = {**variant, "eplb": "hash"}
    return variant_key(variant)


def replica_rules() -> list[str]:
    """The replica rules this vLLM offers (EPLBConfig.replica_selection's
    Literal), "hash" first; stock has only the hash rule."""
    from vllm.config import EPLBConfig

    hints = typing.get_type_hints(EPLBConfig)
    if "replica_selection" not in hints:
        return ["hash"]
    rules = list(typing.get_args(hints["replica_selection"]))
    return sorted(rules, key=lambda r: r != "hash")


EPLB_AXES = {"rank": [3, 0, 1], "map": list(MAP_WIDTHS)}


def _valid_eplb(v: dict) -> bool:
    """Rank and map width mean something only with EPLB on; off, they keep
    their first value (and stay out of the key)."""
    return v["eplb"] != "off" or all(v[a] == vals[0] for a, vals in EPLB_AXES.items())


def _pairs(v: dict, names: list[str]) -> set:
    return {((a, v[a]), (b, v[b])) for i, a in enumerate(names) for b in names[i + 1 :]}


def sample(
    axes: dict[str, list], valid: Callable[[dict], bool], full: bool
) -> list[dict]:
    """The variants to launch: with `full`, every valid combination of the axes.
    Otherwise an all-pairs sample: every pair of values of two axes that some
    valid variant has appears in at least one chosen variant (so every rule
    meets every token count, quantisation, ...), chosen greedily from the base
    variant (each axis at its first value) on. Deterministic."""
    names = list(axes)
    cands = [
        dict(zip(names, values, strict=True))
        for values in itertools.product(*(axes[n] for n in names))
    ]
    cands = [c for c in cands if valid(c)]
    if full:
        return cands
    uncovered = set().union(*(_pairs(c, names) for c in cands))
    chosen = []
    base = {n: axes[n][0] for n in names}
    pick = base if valid(base) else cands[0]
    while True:
        chosen.append(pick)
        uncovered -= _pairs(pick, names)
        if not uncovered:
            return chosen
        pick = max(cands, key=lambda c: len(_pairs(c, names) & uncovered))


def driver_variants(driver: Driver, mod, rules: list[str], full: bool) -> list[dict]:
    """The patched-side variants of a driver: its own axes, and the EPLB axes
    where its wrapper takes an EPLB state."""
    axes = dict(driver.axes(mod))
    if driver.eplb(mod):
        modes = rules if driver.eplb_only else ["off", *rules]
        axes.update(eplb=modes, **EPLB_AXES)
    else:
        axes["eplb"] = ["off"]
    out = sample(axes, lambda v: driver.valid(v) and _valid_eplb(v), full)
    for v in out:
        if v["eplb"] == "off":
            for a in EPLB_AXES:
                v.pop(a, None)
    return out


def stock_variants(driver: Driver, mod, variants: list[dict]) -> list[dict]:
    """The stock launches the patched variants are compared with (see
    stock_key), once each; EPLB ones only where the stock wrapper takes EPLB."""
    out = {}
    for v in variants:
        if v["eplb"] != "off":
            if not driver.eplb(mod):
                continue
            v = {**v, "eplb": "hash"}
        out.setdefault(variant_key(v), v)
    return list(out.values())


def _dataclass_fields(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def eplb_layer_state(variant: dict, num_tokens: int, torch):
    """An EplbLayerState as EplbState.add_model and _propagate_shared_tensors
    leave it on EP rank `variant["rank"]` (dtypes from eplb_state.py); the
    replica rule and rank are set only where this vLLM has those fields."""
    from vllm.distributed.eplb.eplb_state import EplbLayerState

    width = MAP_WIDTHS[variant["map"]]
    mapping = torch.full((1, NUM_LOGICAL, width), -1, dtype=torch.int64)
    mapping[0, :, 0] = torch.arange(NUM_LOGICAL)
    mapping[0, :NUM_REDUNDANT, 1] = torch.arange(NUM_LOGICAL, NUM_PHYSICAL)
    counts = torch.ones((1, NUM_LOGICAL), dtype=torch.int64)
    counts[0, :NUM_REDUNDANT] = 2
    load = torch.zeros((1, NUM_PHYSICAL), dtype=torch.int32)
    state = EplbLayerState()
    state.set_layer_state(0, load, mapping, counts)
    state.should_record_tensor = torch.zeros((), dtype=torch.bool)
    state.num_unpadded_tokens_tensors = [torch.tensor(num_tokens, dtype=torch.int32)]
    fields = _dataclass_fields(EplbLayerState)
    wanted = {
        "replica_selection": variant["eplb"],
        "ep_rank": variant["rank"],
        "ep_size": EP_SIZE,
        "experts_per_rank": NUM_PHYSICAL // EP_SIZE,
    }
    for name, value in wanted.items():
        if name in fields:
            setattr(state, name, value)
    if variant["eplb"] != "hash" and "replica_selection" not in fields:
        raise RuntimeError(f"this vLLM has no replica rule {variant['eplb']!r}")
    return state


def _eplb_kwarg(wrapper: Callable, variant: dict, num_tokens: int, torch) -> dict:
    """The EPLB argument of a staging wrapper: `eplb_state=` (vLLM 0.34.0+)."""
    if variant["eplb"] == "off":
        return {}
    params = inspect.signature(wrapper).parameters
    if "eplb_state" in params:
        return {"eplb_state": eplb_layer_state(variant, num_tokens, torch)}
    raise RuntimeError(
        f"{wrapper.__qualname__}{inspect.signature(wrapper)} takes no eplb_state; "
        "teach tests/aot_drivers.py this vLLM's EPLB staging API"
    )


@dataclasses.dataclass
class Driver:
    """One launch wrapper: where it is, the axes of its inputs (first value =
    base), which combinations it accepts, whether it takes an EPLB state, and
    how to call it."""

    name: str
    module: str
    axes: Callable[[object], dict[str, list]]
    launch: Callable[[object, dict], None]
    eplb: Callable[[object], bool]
    valid: Callable[[dict], bool] = lambda v: True
    eplb_only: bool = False  # launches a kernel only with EPLB on
    setup: Callable[[], object] | None = None

    def load(self):
        return self.setup() if self.setup else importlib.import_module(self.module)


# --- MegaMoE MXFP8 / BF16 staging: prepare_megamoe_inputs ---------------------

_TOKENS_MXFP8 = [16, 64, 1024]  # BLOCK_M 1, 8 and 32


def _mxfp8_axes(mod) -> dict[str, list]:
    return dict(
        quant=["mxfp8", "bf16", "fp8-fp32-scale"],
        shared=["none", "fp8"],
        padding=["yes", "no"],
        tokens=[64, 16, 1024],  # BLOCK_M 8, 1 and 32
        ids=["i32", "i64"],
    )


def _mxfp8_valid(v: dict) -> bool:
    # The shared-expert scale layout exists only for UE8M0 (MXFP8) scales: the
    # wrapper rejects it otherwise.
    return v["shared"] == "none" or v["quant"] == "mxfp8"


def _mxfp8_launch(mod, v: dict) -> None:
    import torch
    from vllm.model_executor.layers.quantization.utils import quant_utils as qu

    t = v["tokens"]
    hidden_quant = {
        "mxfp8": qu.kMxfp8Dynamic,  # MegaMoE's MXFP4 and MXFP8 formats
        "bf16": None,  # MegaMoE's BF16 format
        "fp8-fp32-scale": qu.kFp8Dynamic128Sym,  # fp32 scales: USE_UE8M0 off
    }[v["quant"]]
    if hidden_quant is None:
        x = torch.empty(t, HIDDEN, dtype=torch.bfloat16)
        x_sf = None
    else:
        x = torch.empty(t, HIDDEN, dtype=qu.FP8_DTYPE)
        group = hidden_quant.scale.group_shape.col
        if v["quant"] == "mxfp8":
            x_sf = torch.empty(t, HIDDEN // 128, dtype=torch.int32)
        else:
            x_sf = torch.empty(t, HIDDEN // group, dtype=torch.float32)
    shared = {}
    if v["shared"] == "fp8":
        rows = -(-t // SHARED_BLOCK_M) * 128 * -(-SHARED_BLOCK_M // 128)
        shared = dict(
            shared_x_sf=torch.empty(rows, HIDDEN // 128, dtype=torch.int32),
            shared_block_m=SHARED_BLOCK_M,
        )
    ids_dtype = torch.int32 if v["ids"] == "i32" else torch.int64
    mod.prepare_megamoe_inputs(
        torch.empty(t, HIDDEN, dtype=torch.bfloat16),
        torch.empty(t, TOP_K, dtype=torch.float32),
        torch.zeros(t, TOP_K, dtype=ids_dtype),
        x,
        x_sf,
        torch.empty(t, TOP_K, dtype=torch.int64),
        torch.empty(t, TOP_K, dtype=torch.float32),
        is_padding=torch.zeros(t, dtype=torch.bool) if v["padding"] == "yes" else None,
        hidden_quant=hidden_quant,
        **shared,
        **_eplb_kwarg(mod.prepare_megamoe_inputs, v, t, torch),
    )


# --- MegaMoE NVFP4 staging: prepare_megamoe_nvfp4_inputs ----------------------


def _nvfp4_axes(mod) -> dict[str, list]:
    return dict(
        quant=["nvfp4", "nvfp4+l2-alpha"],
        shared=["none", "bf16", "fp8"],
        padding=["yes", "no"],
        tokens=[16, 1024],  # rows split over programs (<= 512), one per row
        ids=["i32", "i64"],
    )


def _nvfp4_launch(mod, v: dict) -> None:
    import torch
    from vllm.model_executor.layers.quantization.utils import quant_utils as qu

    t = v["tokens"]
    extra = {}
    if v["shared"] == "bf16":
        extra["shared_x"] = torch.empty(t, HIDDEN, dtype=torch.bfloat16)
    elif v["shared"] == "fp8":
        rows = -(-t // SHARED_BLOCK_M) * 128 * -(-SHARED_BLOCK_M // 128)
        extra.update(
            shared_x=torch.empty(t, HIDDEN, dtype=qu.FP8_DTYPE),
            shared_x_sf=torch.empty(rows, HIDDEN // 128, dtype=torch.int32),
            shared_block_m=SHARED_BLOCK_M,
        )
    if v["quant"] == "nvfp4+l2-alpha":
        num_local = NUM_PHYSICAL // EP_SIZE
        extra.update(
            w2_global_scale=torch.empty(num_local, dtype=torch.float32),
            l2_alpha=torch.empty(num_local, dtype=torch.float32),
            l2_activation_scale=0.5,
        )
    ids_dtype = torch.int32 if v["ids"] == "i32" else torch.int64
    mod.prepare_megamoe_nvfp4_inputs(
        torch.empty(t, HIDDEN, dtype=torch.bfloat16),
        torch.empty(t, TOP_K, dtype=torch.float32),
        torch.zeros(t, TOP_K, dtype=ids_dtype),
        torch.empty(t, HIDDEN // 2, dtype=torch.uint8),
        torch.empty(t, HIDDEN // 64, dtype=torch.int32),
        torch.empty(t, dtype=torch.float32),
        torch.empty(t, TOP_K, dtype=torch.int64),
        torch.empty(t, TOP_K, dtype=torch.float32),
        is_padding=torch.zeros(t, dtype=torch.bool) if v["padding"] == "yes" else None,
        **extra,
        **_eplb_kwarg(mod.prepare_megamoe_nvfp4_inputs, v, t, torch),
    )


# --- The router's EPLB mapping: BaseRouter._apply_eplb_mapping ---------------


def _router_module():
    """base_router defines its Triton path only on CUDA-alike platforms and
    the worker runs vLLM on the CPU platform (no driver), so the module is
    re-executed once with is_cuda_alike() answering True."""
    from vllm.platforms import current_platform

    mod = importlib.import_module(
        "vllm.model_executor.layers.fused_moe.router.base_router"
    )
    with mock.patch.object(current_platform, "is_cuda_alike", lambda: True):
        return importlib.reload(mod)


def _router_axes(mod) -> dict[str, list]:
    return dict(tokens=[64], ids=["i32", "i64"])


def _router_launch(mod, v: dict) -> None:
    import torch

    t = v["tokens"]
    ids_dtype = torch.int32 if v["ids"] == "i32" else torch.int64
    router = SimpleNamespace(eplb_state=eplb_layer_state(v, t, torch))
    mod.BaseRouter._apply_eplb_mapping(router, torch.zeros(t, TOP_K, dtype=ids_dtype))


def _staging_takes_eplb(name: str) -> Callable[[object], bool]:
    return lambda mod: "eplb_state" in inspect.signature(getattr(mod, name)).parameters


DRIVERS = [
    Driver(
        "prepare_megamoe_inputs",
        "vllm.model_executor.layers.fused_moe.prepare_megamoe",
        _mxfp8_axes,
        _mxfp8_launch,
        _staging_takes_eplb("prepare_megamoe_inputs"),
        valid=_mxfp8_valid,
    ),
    Driver(
        "prepare_megamoe_nvfp4_inputs",
        "vllm.model_executor.layers.fused_moe.prepare_megamoe",
        _nvfp4_axes,
        _nvfp4_launch,
        _staging_takes_eplb("prepare_megamoe_nvfp4_inputs"),
    ),
    Driver(
        "BaseRouter._apply_eplb_mapping",
        "vllm.model_executor.layers.fused_moe.router.base_router",
        _router_axes,
        _router_launch,
        lambda mod: True,
        eplb_only=True,  # without EPLB the router launches nothing
        setup=_router_module,
    ),
]
