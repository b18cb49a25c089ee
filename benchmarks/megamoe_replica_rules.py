#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""EPLB replica-selection rules over DEP32-like traffic, checked on the kernels.

1. Simulates DEP32 decode traffic (32 EP ranks, 384 logical experts, 32
   redundant slots placed by vLLM's default EPLB policy from a skewed load
   distribution; 1-12 rows per rank, or DSpark verify of 6 tokens per request)
   and reports max/mean tokens per physical slot and per rank for every
   ``EPLBConfig.replica_selection`` rule, using the torch reference
   ``choose_replicas`` below.
2. Cross-checks that reference against both callers of vLLM's
   ``eplb_map_and_record`` (the router kernel and MegaMoE's mxfp8 input
   staging) on DEP32 tables for several EP ranks, so the simulated rule is
   the one the kernels run. On CPU the kernels run under the Triton
   interpreter.

Run with the patched vLLM installed (scripts/test's environment) or with a
patched source tree on PYTHONPATH:
    VLLM_TARGET_DEVICE=cpu PYTHONPATH=<patched vllm tree> \
        python benchmarks/megamoe_replica_rules.py --steps 200
"""

import os

import torch

if not torch.accelerator.is_available():
    # The interpreter has to be chosen before vLLM (and Triton) is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import vllm  # noqa: E402
from vllm.distributed.eplb.eplb_state import EplbLayerState  # noqa: E402
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy  # noqa: E402
from vllm.model_executor.layers.fused_moe.eplb_triton import (  # noqa: E402
    REPLICA_RULES,
    replica_rule_args,
)
from vllm.model_executor.layers.fused_moe.prepare_megamoe import (  # noqa: E402
    prepare_megamoe_inputs,
)
from vllm.model_executor.layers.fused_moe.router import base_router  # noqa: E402
from vllm.platforms import current_platform  # noqa: E402

if not hasattr(base_router, "_eplb_map_and_record_triton"):
    # vLLM defines the router kernel on CUDA-alike and XPU platforms only: on CPU,
    # execute the module once more as there, so that the cross-check runs the
    # production kernel under the interpreter.
    import importlib  # noqa: E402
    from unittest import mock  # noqa: E402

    with mock.patch.object(current_platform, "is_cuda_alike", lambda: True):
        base_router = importlib.reload(base_router)

RANKS, LOGICAL, REDUNDANT, TOP_K = 32, 384, 32, 6
PHYSICAL = LOGICAL + REDUNDANT
SLOTS_PER_RANK = PHYSICAL // RANKS
# EplbState pads every logical_to_physical_map row to R + 1 (1024 only with
# elastic EP); the kernels take the width at run time.
MAP_WIDTH = REDUNDANT + 1
# floor(2^32 / phi): the multiplier of vLLM's replica hash.
KNUTH_MULTIPLIER = 2654435769
HIDDEN = 128
CHECK_SITES = ("router", "mxfp8")
CHECK_RANKS = (0, 17, 31)
DEVICE = (
    torch.accelerator.current_accelerator().type
    if torch.accelerator.is_available()
    else "cpu"
)


def choose_replicas(
    rule: str,
    rows: torch.Tensor,
    ids: torch.Tensor,
    logical_to_physical_map: torch.Tensor,
    logical_replica_count: torch.Tensor,
    ep_rank: int = 0,
    experts_per_rank: int = 1,
) -> torch.Tensor:
    """Slot each ``EPLBConfig.replica_selection`` rule picks for valid ids.

    "hash" is vLLM's ``((row * K) & 0xFFFFFFFF) % max(count, 1)``. ``rows``
    (the row on the sending rank) broadcasts against ``ids``, which must all
    lie in ``[0, num_logical)``.
    """
    counts = logical_replica_count[ids].clamp(min=1)
    hashed = (rows.to(torch.int64) * KNUTH_MULTIPLIER) & 0xFFFFFFFF
    if rule != "hash":
        hashed = hashed + ep_rank
    physical = logical_to_physical_map[ids, hashed % counts]
    if rule == "local_first":
        width = int(counts.max()) if counts.numel() else 0
        replicas = logical_to_physical_map[ids][..., :width]
        live = torch.arange(width) < counts[..., None]
        is_local = live & (replicas >= 0) & (replicas // experts_per_rank == ep_rank)
        first_local = torch.where(is_local.any(-1), is_local.int().argmax(-1), -1)
        local = replicas.gather(-1, first_local.clamp(min=0)[..., None])[..., 0]
        physical = torch.where(first_local >= 0, local, physical)
    elif rule not in ("hash", "rank_hash"):
        raise ValueError(f"unknown replica rule {rule!r}")
    return physical


def build_tables(popularity: torch.Tensor):
    """Placement vLLM's default EPLB policy picks for this expected load."""
    phy2log = DefaultEplbPolicy.rebalance_experts(
        (popularity * 1e6)[None], PHYSICAL, 1, 1, RANKS
    )[0]
    phy2log = torch.as_tensor(phy2log, dtype=torch.int64)
    mapping = torch.full((LOGICAL, MAP_WIDTH), -1, dtype=torch.int64)
    counts = torch.zeros(LOGICAL, dtype=torch.int64)
    for slot, e in enumerate(phy2log.tolist()):
        mapping[e, counts[e]] = slot
        counts[e] += 1
    return mapping, counts, phy2log


def rank_tokens(gen, popularity, num_rows, request_rows):
    """Top-k ids of one rank's rows; rows of a request share favourite experts."""
    ids = []
    for start in range(0, num_rows, request_rows):
        rows = min(request_rows, num_rows - start)
        favourites = torch.multinomial(popularity, 12, generator=gen)
        probs = 0.5 * popularity.clone()
        probs[favourites] += 0.5 / 12
        ids.append(torch.multinomial(probs.expand(rows, -1), TOP_K, generator=gen))
    return torch.cat(ids)


def simulate(args, traffic: str, zipf: float, gen: torch.Generator) -> dict:
    ranks = torch.randperm(LOGICAL, generator=gen)
    popularity = 1.0 / (ranks.double() + 1) ** zipf
    popularity /= popularity.sum()
    mapping, counts, _ = build_tables(popularity)
    stats = {rule: dict(slot=[], rank=[], local=[]) for rule in REPLICA_RULES}
    for _ in range(args.steps):
        step_ids = []
        for _rank in range(RANKS):
            if traffic == "dspark":
                num_rows, request_rows = (
                    6 * int(torch.randint(1, 3, (), generator=gen)),
                    6,
                )
            else:
                num_rows = int(torch.randint(1, 13, (), generator=gen))
                request_rows = 1
            step_ids.append(rank_tokens(gen, popularity, num_rows, request_rows))
        for rule in REPLICA_RULES:
            slot_load = torch.zeros(PHYSICAL, dtype=torch.int64)
            local = 0
            for rank, ids in enumerate(step_ids):
                rows = torch.arange(ids.shape[0])[:, None]
                slots = choose_replicas(
                    rule, rows, ids, mapping, counts, rank, SLOTS_PER_RANK
                )
                slot_load += torch.bincount(slots.flatten(), minlength=PHYSICAL)
                local += int((slots // SLOTS_PER_RANK == rank).sum())
            rank_load = slot_load.view(RANKS, SLOTS_PER_RANK).sum(1)
            total = int(slot_load.sum())
            stats[rule]["slot"].append(slot_load.max().item() / (total / PHYSICAL))
            stats[rule]["rank"].append(rank_load.max().item() / (total / RANKS))
            stats[rule]["local"].append(local / total)
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {
        "traffic": traffic,
        "zipf": zipf,
        "replica_counts": torch.bincount(counts).tolist(),
        "rules": {
            rule: {
                "slot_max_over_mean": round(mean(s["slot"]), 4),
                "rank_max_over_mean": round(mean(s["rank"]), 4),
                "local_fraction": round(mean(s["local"]), 4),
            }
            for rule, s in stats.items()
        },
    }


def run_call_site(site, hidden, weights, ids, is_padding, state):
    """Physical ids from one caller of ``eplb_map_and_record``.

    Routers set padded rows' ids to -1 before the mapping; MegaMoE's staging
    kernel takes the padding mask itself."""
    if site == "router":
        if is_padding is not None:
            ids = torch.where(is_padding[:, None], -1, ids)
        return base_router._eplb_map_and_record_triton(
            ids,
            state.logical_to_physical_map,
            state.logical_replica_count,
            state.expert_load_view,
            state.should_record_tensor,
            state.num_unpadded_tokens_tensors[0],
            replica_rule_args=replica_rule_args(state),
        )
    num_tokens = hidden.shape[0]
    topk_idx = torch.full((num_tokens, TOP_K), -7, dtype=torch.int64, device=DEVICE)
    prepare_megamoe_inputs(
        hidden,
        weights,
        ids,
        torch.empty((num_tokens, HIDDEN), dtype=torch.float8_e4m3fn, device=DEVICE),
        torch.zeros((num_tokens, HIDDEN // 128), dtype=torch.int32, device=DEVICE),
        topk_idx,
        torch.empty((num_tokens, TOP_K), device=DEVICE),
        is_padding=is_padding,
        eplb_state=state,
    )
    return topk_idx


def cross_check_kernels(gen: torch.Generator, seed: int) -> dict:
    """Router kernel and mxfp8 staging vs ``choose_replicas`` on DEP32 tables."""
    # Drawn from the simulation's generator first, as in the 0.33.0 version
    # of this script, so that the simulated traffic stays the same.
    popularity = torch.rand(LOGICAL, generator=gen, dtype=torch.float64) ** 4
    popularity /= popularity.sum()
    mapping, counts, phy2log = build_tables(popularity)
    decode_ids = rank_tokens(gen, popularity, 12, 6)
    decode_hidden = torch.randn(12, HIDDEN, generator=gen).to(torch.bfloat16)

    # A longer batch with padding, -1 and out-of-range ids.
    own = torch.Generator().manual_seed(seed + 1)
    verify_ids = rank_tokens(own, popularity, 96, 6)
    verify_ids[3, 1], verify_ids[40, 5] = -1, LOGICAL
    verify_hidden = torch.randn(96, HIDDEN, generator=own).to(torch.bfloat16)
    verify_padding = torch.zeros(96, dtype=torch.bool)
    verify_padding[-5:] = True
    batches = [
        (decode_hidden, decode_ids, None, 12),
        (verify_hidden, verify_ids, verify_padding, 91),
    ]

    has_local = torch.zeros(RANKS, LOGICAL, dtype=torch.bool)
    has_local[torch.arange(PHYSICAL) // SLOTS_PER_RANK, phy2log] = True
    cases = lanes = 0
    differs = {rule: 0 for rule in REPLICA_RULES}
    for hidden, ids, is_padding, num_unpadded in batches:
        weights = torch.rand(ids.shape, generator=own)
        routed = (ids >= 0) & (ids < LOGICAL)
        if is_padding is not None:
            routed &= ~is_padding[:, None]
        rows = torch.arange(ids.shape[0])[:, None]
        safe = torch.where(routed, ids, 0)
        for rank in CHECK_RANKS:
            plain = choose_replicas("hash", rows, safe, mapping, counts)
            plain = torch.where(routed, plain, -1)
            for rule in REPLICA_RULES:
                expected = choose_replicas(
                    rule, rows, safe, mapping, counts, rank, SLOTS_PER_RANK
                )
                expected = torch.where(routed, expected, -1)
                for site in CHECK_SITES:
                    load = torch.zeros(PHYSICAL, dtype=torch.int32, device=DEVICE)
                    state = EplbLayerState()
                    state.set_layer_state(
                        0, load[None], mapping[None].to(DEVICE), counts[None].to(DEVICE)
                    )
                    state.should_record_tensor = torch.tensor(True, device=DEVICE)
                    state.num_unpadded_tokens_tensors = [
                        torch.tensor(num_unpadded, dtype=torch.int32, device=DEVICE)
                    ]
                    state.replica_selection, state.ep_rank = rule, rank
                    state.experts_per_rank = SLOTS_PER_RANK
                    chosen = run_call_site(
                        site,
                        *[
                            None if t is None else t.to(DEVICE)
                            for t in (hidden, weights, ids, is_padding)
                        ],
                        state,
                    ).cpu()
                    where = (site, rule, rank, ids.shape[0])
                    assert torch.equal(chosen, expected), where
                    # Checked without the reference: every routed lane lands
                    # on a slot that holds its expert, the rest on -1 ...
                    assert torch.equal(phy2log[chosen[routed]], ids[routed]), where
                    assert torch.all(chosen[~routed] == -1), where
                    # ... local_first stays on this rank where it can ...
                    if rule == "local_first":
                        local = routed & has_local[rank][safe]
                        assert torch.all(chosen[local] // SLOTS_PER_RANK == rank)
                    # ... and the load counts exactly the unpadded rows' lanes.
                    counted = chosen[:num_unpadded]
                    counted = counted[counted >= 0]
                    recorded = torch.bincount(counted, minlength=PHYSICAL)
                    assert torch.equal(load.cpu(), recorded.int()), where
                    cases += 1
                    lanes += int(routed.sum())
                    differs[rule] += int((chosen != plain).sum())
    # The rules have to disagree somewhere, or the check cannot tell them apart.
    assert all(differs[rule] > 0 for rule in REPLICA_RULES if rule != "hash")
    return {
        "cases": cases,
        "sites": list(CHECK_SITES),
        "ep_ranks": list(CHECK_RANKS),
        "rows_per_batch": [int(b[1].shape[0]) for b in batches],
        "routed_lanes_checked": lanes,
        "lanes_differing_from_hash": differs,
    }


def vllm_provenance() -> dict:
    """The vLLM the kernels came from: version, source, git HEAD of a checkout."""
    root = Path(vllm.__file__).resolve().parent.parent
    info = {"vllm_version": vllm.__version__, "vllm_source": str(root)}
    git = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "--show-toplevel", "HEAD"],
        capture_output=True,
        text=True,
    )
    lines = git.stdout.split()
    if git.returncode == 0 and len(lines) == 2 and Path(lines[0]) == root:
        info["vllm_git_head"] = lines[1]
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "megamoe_replica_rules.json",
    )
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    started = time.perf_counter()

    check = cross_check_kernels(gen, args.seed)
    print(
        f"kernel == rule reference on {check['cases']} DEP{RANKS} cases "
        f"({' + '.join(CHECK_SITES)}; EP ranks "
        f"{', '.join(map(str, CHECK_RANKS))}; {check['routed_lanes_checked']} "
        f"routed lanes); lanes differing from hash: "
        f"{check['lanes_differing_from_hash']}"
    )

    sims = []
    for traffic in ("dspark", "decode"):
        for zipf in (1.0, 0.6):
            sims.append(simulate(args, traffic, zipf, gen))
    print(
        f"\nDEP{RANKS}: {LOGICAL} logical + {REDUNDANT} redundant experts, top-{TOP_K},"
        f" {args.steps} steps; max/mean per step, averaged"
    )
    print(
        f"{'traffic':8} {'zipf':>4} {'rule':12} {'slot':>7} {'rank':>7} "
        f"{'rank vs hash':>12} {'local':>6}"
    )
    for sim in sims:
        base = sim["rules"]["hash"]["rank_max_over_mean"]
        for rule, r in sim["rules"].items():
            print(
                f"{sim['traffic']:8} {sim['zipf']:4.1f} {rule:12} "
                f"{r['slot_max_over_mean']:7.3f} {r['rank_max_over_mean']:7.3f} "
                f"{r['rank_max_over_mean'] / base:12.3f} {r['local_fraction']:6.3f}"
            )

    provenance = vllm_provenance()
    summary = {
        "vLLM": provenance["vllm_version"],
        "kernel == reference (router + mxfp8 staging), DEP32 cases": check["cases"],
    }
    for sim in sims:
        base = sim["rules"]["hash"]["rank_max_over_mean"]
        for rule, r in sim["rules"].items():
            summary[
                f"{sim['traffic']} zipf {sim['zipf']}: busiest rank / mean, {rule}"
            ] = f"{r['rank_max_over_mean']:.3f} ({r['rank_max_over_mean'] / base:.3f}x hash)"

    result = {
        "command": " ".join(["python", *sys.argv]),
        "summary": summary,
        **provenance,
        "machine": {
            "processor": platform.processor(),
            "cores": os.cpu_count(),
            "note": (
                f"kernels on {torch.accelerator.current_accelerator()}"
                if torch.accelerator.is_available()
                else "CPU only, not measured on GPU (Triton interpreter)"
            ),
        },
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "runtime_s": round(time.perf_counter() - started, 1),
        "kernel_cross_check": check,
        "simulation": {
            "ranks": RANKS,
            "logical_experts": LOGICAL,
            "redundant_experts": REDUNDANT,
            "top_k": TOP_K,
            "steps": args.steps,
            "seed": args.seed,
            "results": sims,
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out} ({result['runtime_s']} s)")


if __name__ == "__main__":
    main()
