#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""MegaMoE EPLB replica rules over DEP32-like traffic, and launch counts.

1. Simulates DEP32 decode traffic (32 EP ranks, 384 logical experts, 32
   redundant slots placed by vLLM's default EPLB policy from a skewed load
   distribution; 1-12 rows per rank, or DSpark verify of 6 tokens per request)
   and reports max/mean tokens per physical slot and per rank for every
   ``EPLBConfig.replica_selection`` rule. The rules are the torch references
   of tests/kernels/moe/megamoe_eplb_utils.py that the kernel tests check the
   staging kernel against; the script cross-checks them against the kernel
   once more on a DEP32 table.
2. Counts kernel launches per MoE layer in DeepGemmMegaMoEExperts.forward's
   EPLB path before (0.33.0's forward file) and after (the patched one), on
   CPU under the Triton interpreter with DeepGEMM faked.

Run with the patched vLLM installed (scripts/test's environment) after
scripts/test has extracted the series' tests into .vstack/stack-tests, or with
a patched source tree on PYTHONPATH:
    VLLM_TARGET_DEVICE=cpu <test-env>/bin/python benchmarks/megamoe_replica_rules.py
"""

import os

import torch

if not torch.accelerator.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")

import argparse  # noqa: E402
import datetime  # noqa: E402
import importlib.util  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
from contextlib import ExitStack  # noqa: E402
from pathlib import Path  # noqa: E402

import vllm  # noqa: E402

STACK_ROOT = Path(__file__).resolve().parents[1]
# The test helpers live in the series' tests/ tree: beside a source checkout's vllm/,
# or where scripts/test extracts them for the installed wheel.
VLLM_ROOT = Path(vllm.__file__).resolve().parent.parent
if not (VLLM_ROOT / "tests" / "kernels" / "moe").is_dir():
    VLLM_ROOT = STACK_ROOT / ".vstack" / "stack-tests"
sys.path.insert(0, str(VLLM_ROOT))

from tests.kernels.moe.megamoe_eplb_utils import (  # noqa: E402
    MAP_WIDTH,
    REPLICA_RULES,
    LaunchCounter,
    choose_replicas,
    load_reference_router,
    make_cpu_megamoe_layer,
    staging_buffers,
)
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy  # noqa: E402

RANKS, LOGICAL, REDUNDANT, TOP_K = 32, 384, 32, 6
PHYSICAL = LOGICAL + REDUNDANT
SLOTS_PER_RANK = PHYSICAL // RANKS


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


def cross_check_kernel(gen: torch.Generator) -> int:
    """Staging kernel vs the rule references on a DEP32 table, one rank."""
    from vllm.model_executor.layers.fused_moe.prepare_megamoe import (
        MegaMoEEplbArgs,
        prepare_megamoe_inputs,
    )

    popularity = torch.rand(LOGICAL, generator=gen, dtype=torch.float64) ** 4
    popularity /= popularity.sum()
    mapping, counts, _ = build_tables(popularity)
    ids = rank_tokens(gen, popularity, 12, 6)
    hidden = torch.randn(12, 128, generator=gen).to(torch.bfloat16)
    checked = 0
    for rank in (0, 17):
        for rule in REPLICA_RULES:
            out = staging_buffers("mxfp8", 12, 128, TOP_K)
            load = torch.zeros(PHYSICAL, dtype=torch.int32)
            eplb = MegaMoEEplbArgs(
                mapping,
                counts,
                load,
                torch.tensor(True),
                None,
                rule,
                rank,
                SLOTS_PER_RANK,
            )
            prepare_megamoe_inputs(
                hidden,
                torch.rand(12, TOP_K),
                ids,
                out["x"],
                out["x_sf"],
                out["topk_idx"],
                out["topk_weights"],
                eplb=eplb,
            )
            expected = choose_replicas(
                rule,
                torch.arange(12)[:, None],
                ids,
                mapping,
                counts,
                rank,
                SLOTS_PER_RANK,
            )
            assert torch.equal(out["topk_idx"], expected), (rule, rank)
            assert torch.equal(
                load, torch.bincount(expected.flatten(), minlength=PHYSICAL).int()
            )
            checked += 1
    return checked


def count_launches(before_src: Path) -> dict:
    """Kernels per MoE layer in forward's EPLB path, 0.33.0 vs patched."""
    from vllm.model_executor.layers.fused_moe import deep_gemm_mega_moe as after

    spec = importlib.util.spec_from_file_location("_megamoe_forward_0330", before_src)
    before = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(before)
    # On CPU the imported map function is base_router's pass-through; give the
    # 0.33.0 forward its Triton kernel, as on a CUDA platform.
    before.eplb_map_to_physical_and_record = (
        load_reference_router().eplb_map_to_physical_and_record
    )
    num_tokens = 12
    is_padding = torch.zeros(num_tokens, dtype=torch.bool)
    is_padding[-2:] = True
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(num_tokens, 128, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, 16, (num_tokens, TOP_K), generator=gen)
    weights = torch.rand(num_tokens, TOP_K, generator=gen)
    results = {}
    for fmt in ("mxfp8", "nvfp4"):
        staged = {}
        for name, module in (("before", before), ("after", after)):
            with ExitStack() as stack:
                layer, launched = make_cpu_megamoe_layer(
                    stack,
                    module,
                    fmt,
                    num_logical=16,
                    top_k=TOP_K,
                    replica_counts=[2, 3, 1, 4] * 4,
                    num_unpadded=num_tokens - 2,
                    is_padding=is_padding,
                )
                with LaunchCounter().count() as counter:
                    layer(hidden, weights, ids)
            staged[name] = (launched[0].clone(), layer.eplb_state.expert_load_view)
            results.setdefault(fmt, {})[name] = {
                "triton_launches": dict(counter.triton_launches),
                "torch_kernels": dict(counter.torch_ops),
                "allocations": dict(counter.allocations),
                "kernels": counter.kernels,
            }
        assert torch.equal(staged["before"][0], staged["after"][0])
        assert torch.equal(staged["before"][1], staged["after"][1])
        results[fmt]["same_ids_and_load"] = True
    return results


def _base_file(path: str) -> Path:
    """A file of the pinned, unpatched base, from the stack repository."""
    import subprocess
    import tempfile

    version = vllm.__version__.split("+")[0]
    data = subprocess.run(
        ["git", "-C", str(STACK_ROOT / ".vstack" / "repo"), "show",
         f"base/{version}:{path}"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    out = Path(tempfile.mkdtemp()) / Path(path).name
    out.write_bytes(data)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--before-src",
        type=Path,
        default=None,
        help="0.33.0's deep_gemm_mega_moe.py, for the launch count before "
        "(default: taken from the stack's pinned base in .vstack/repo)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "results" / "megamoe_replica_rules.json",
    )
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(args.seed)

    if args.before_src is None:
        args.before_src = _base_file(
            "vllm/model_executor/layers/fused_moe/deep_gemm_mega_moe.py"
        )
    checked = cross_check_kernel(gen)
    print(f"kernel == rule reference on {checked} DEP32 cases (Triton staging)")

    launches = count_launches(args.before_src)
    print("\nKernels per MoE layer in forward (12 rows, EPLB on, skip-padding on)")
    print(f"{'format':8} {'':7} {'triton':>7} {'torch':>6} {'alloc':>6}  detail")
    for fmt, res in launches.items():
        for when in ("before", "after"):
            r = res[when]
            print(
                f"{fmt:8} {when:7} {sum(r['triton_launches'].values()):7d} "
                f"{sum(r['torch_kernels'].values()):6d} "
                f"{sum(r['allocations'].values()):6d}  "
                f"{r['triton_launches']} {r['torch_kernels']}"
            )
        print(
            f"{fmt:8} ratio   kernels after/before = "
            f"{res['after']['kernels']}/{res['before']['kernels']}"
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

    summary = {
        f"kernels per MoE layer, {fmt}, before / after": (
            f"{launches[fmt]['before']['kernels']} / {launches[fmt]['after']['kernels']}"
        )
        for fmt in ("mxfp8", "nvfp4")
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
        "vllm_source": str(VLLM_ROOT),
        "machine": {
            "processor": platform.processor(),
            "cores": os.cpu_count(),
            "note": "CPU only, not measured on GPU (Triton interpreter)",
        },
        "timestamp": datetime.datetime.now(datetime.UTC).isoformat(),
        "kernel_cross_check_cases": checked,
        "launch_counts_per_layer": launches,
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
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
