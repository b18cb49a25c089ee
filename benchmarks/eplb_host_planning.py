# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Microbenchmark: EPLB host-side planning, stock vLLM 0.34.0 vs vectorised.

Times, at DeepSeek-like shapes, the three pieces of host work the async EPLB
worker (or the main thread in sync mode) runs per rearrangement:

- ``DefaultEplbPolicy.balanced_packing`` alone and the whole
  ``rebalance_experts`` policy that calls it;
- ``get_ep_ranks_with_experts_batch`` for every layer, send and receive sides,
  as ``move_to_buffer`` calls it on one rank;
- the logical-load reduction of ``EplbState.rearrange()`` on a CPU window.

The stock implementations are copied below from vLLM 0.34.0; the new ones are
imported from the vLLM on ``sys.path``. Both run in the same process, outputs
are checked equal, and the table prints old, new and old/new side by side.

    python benchmarks/eplb_host_planning.py [--repeats N] [--quick]
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from vllm.distributed.eplb.eplb_state import _logical_expert_load
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy
from vllm.distributed.eplb.rebalance_execute import get_ep_ranks_with_experts_batch

RESULTS = Path(__file__).parent / "results" / "eplb_host_planning.json"


# ---- vLLM 0.34.0 implementations (verbatim logic) --------------------------


def stock_balanced_packing(weight: np.ndarray, num_packs: int):
    num_layers, num_groups = weight.shape
    groups_per_pack = num_groups // num_packs
    if groups_per_pack == 1:
        pack_index = np.tile(np.arange(num_groups, dtype=np.int64), (num_layers, 1))
        return pack_index, np.zeros_like(pack_index, dtype=np.int64)
    indices = np.argsort(-weight, axis=-1)
    pack_index = np.full((num_layers, num_groups), -1, dtype=np.int64)
    rank_in_pack = np.full((num_layers, num_groups), -1, dtype=np.int64)
    pack_weights = np.zeros((num_layers, num_packs), dtype=np.float64)
    pack_items = np.zeros((num_layers, num_packs), dtype=np.int64)
    for layer_idx in range(num_layers):
        weights_row = pack_weights[layer_idx]
        items_row = pack_items[layer_idx]
        for group in indices[layer_idx]:
            pack = int(np.argmin(weights_row))
            pack_index[layer_idx, group] = pack
            rank_in_pack[layer_idx, group] = items_row[pack]
            weights_row[pack] += weight[layer_idx, group]
            items_row[pack] += 1
            if items_row[pack] == groups_per_pack:
                weights_row[pack] = np.inf
    return pack_index, rank_in_pack


class StockPolicy(DefaultEplbPolicy):
    @classmethod
    def balanced_packing(cls, weight, num_packs):
        return stock_balanced_packing(weight, num_packs)


def stock_get_ep_ranks_with_experts_batch(
    expert_ids, num_local_experts, old_indices, new_indices
):
    send_map: dict[int, list[int]] = {}
    recv_map: dict[int, list[int]] = {}
    if expert_ids.size == 0:
        return send_map, recv_map
    unique_experts = np.unique(expert_ids)
    position_indices = np.arange(len(old_indices), dtype=np.int32)
    for indices, out in ((old_indices, send_map), (new_indices, recv_map)):
        mask = np.isin(indices, unique_experts)
        if not np.any(mask):
            continue
        positions = position_indices[mask]
        experts = indices[mask]
        ranks = positions // num_local_experts
        order = np.lexsort((positions, experts))
        experts = experts[order]
        ranks = ranks[order]
        bounds = np.concatenate(
            [[0], np.where(np.diff(experts) != 0)[0] + 1, [len(experts)]]
        )
        for i in range(len(bounds) - 1):
            start, end = bounds[i], bounds[i + 1]
            expert = int(experts[start])
            expert_ranks = ranks[start:end]
            _, unique_idx = np.unique(expert_ranks, return_index=True)
            unique_ranks = expert_ranks[np.sort(unique_idx)]
            if out is send_map:
                send_map[expert] = unique_ranks.tolist()
            else:
                senders = set(send_map.get(expert, []))
                recv_map[expert] = [int(r) for r in unique_ranks if r not in senders]
    for expert in unique_experts.tolist():
        send_map.setdefault(expert, [])
        recv_map.setdefault(expert, [])
    return send_map, recv_map


def stock_logical_expert_load(window, physical_to_logical, num_logical):
    invalid_idx = num_logical
    logical = torch.zeros(
        window.shape[0], window.shape[1], invalid_idx + 1, dtype=window.dtype
    )
    logical.scatter_add_(
        dim=-1,
        index=physical_to_logical.masked_fill(physical_to_logical < 0, invalid_idx)
        .unsqueeze(0)
        .expand_as(window)
        .long(),
        src=window,
    )
    return logical[..., :-1].sum(dim=0)


# ---- harness ---------------------------------------------------------------


def timed(fn, repeats: int) -> tuple[float, object]:
    """Median wall time in ms over ``repeats`` runs, and the last result."""
    result = fn()  # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        samples.append((time.perf_counter() - start) * 1e3)
    return statistics.median(samples), result


def skewed_load(rng, num_layers, num_logical):
    # Zipf-like token counts: a few hot experts per layer, as in real traffic.
    return torch.from_numpy(
        (rng.zipf(1.3, (num_layers, num_logical)) * 100).clip(max=10**7)
    )


def compare(name, shape, stock_fn, new_fn, repeats, rows, check=None):
    old_ms, old_out = timed(stock_fn, repeats)
    new_ms, new_out = timed(new_fn, repeats)
    if check is not None:
        check(old_out, new_out)
    rows.append(
        {
            "name": name,
            "shape": shape,
            "stock_ms": round(old_ms, 3),
            "new_ms": round(new_ms, 3),
            "ratio": round(old_ms / new_ms, 2),
        }
    )
    print(
        f"{name:<28} {shape:<34} {old_ms:>10.2f} {new_ms:>10.2f} "
        f"{old_ms / new_ms:>8.1f}x",
        flush=True,
    )


def arrays_equal(a, b):
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def lists_equal(a, b):
    assert a == b


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--window", type=int, default=1000)
    parser.add_argument(
        "--quick", action="store_true", help="one small shape per piece"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args()

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    num_logical, num_groups = 256, 8
    # (layers, EP size, physical experts): 288 = 256 + 32 redundant; 288 is
    # not divisible by 64, so EP64 uses 320 (5 local experts per rank).
    configs = [(43, 8, 288), (61, 8, 288), (61, 16, 288), (61, 32, 288)]
    configs.append((61, 64, 320))
    if args.quick:
        configs = [(43, 8, 288)]
    rows: list[dict] = []
    print(f"{'piece':<28} {'shape':<34} {'stock ms':>10} {'new ms':>10} {'ratio':>9}")

    for num_layers, ep, num_physical in configs:
        num_nodes = max(1, ep // 8)
        load = skewed_load(rng, num_layers, num_logical)
        shape = f"L={num_layers} P={num_physical} EP={ep} nodes={num_nodes}"
        # The inner packing of the hierarchical policy: physical experts of a
        # node onto its GPUs.
        per_phy = rng.random((num_layers * num_nodes, num_physical // num_nodes))
        compare(
            "balanced_packing",
            shape,
            lambda w=per_phy, n=ep // num_nodes: stock_balanced_packing(w, n),
            lambda w=per_phy, n=ep // num_nodes: DefaultEplbPolicy.balanced_packing(
                w, n
            ),
            args.repeats,
            rows,
            arrays_equal,
        )
        old_map = torch.from_numpy(
            np.tile(np.arange(num_physical) % num_logical, (num_layers, 1))
        )
        policy_args = (load, num_physical, num_groups, num_nodes, ep, old_map)
        compare(
            "rebalance_experts (policy)",
            shape,
            lambda a=policy_args: StockPolicy.rebalance_experts(*a),
            lambda a=policy_args: DefaultEplbPolicy.rebalance_experts(*a),
            args.repeats,
            rows,
            lambda x, y: torch.testing.assert_close(x, y, rtol=0, atol=0),
        )

        new_map = DefaultEplbPolicy.rebalance_experts(*policy_args).numpy()
        num_local = num_physical // ep
        old_np = old_map.numpy()

        def all_layers(
            fn, old_np=old_np, new_map=new_map, num_local=num_local, layers=num_layers
        ):
            # move_to_buffer on rank 0: one call for its sends, one for its
            # receives, per layer.
            out = []
            for layer in range(layers):
                old, new = old_np[layer], new_map[layer]
                local_old, local_new = old[:num_local], new[:num_local]
                sends = np.unique(local_old[local_old != -1])
                recvs = np.setdiff1d(local_new, local_old)
                out.append(fn(sends, num_local, old, new))
                out.append(fn(recvs, num_local, old, new))
            return out

        compare(
            "get_ep_ranks_with_experts",
            shape + " x2/layer",
            lambda f=all_layers: f(stock_get_ep_ranks_with_experts_batch),
            lambda f=all_layers: f(get_ep_ranks_with_experts_batch),
            args.repeats,
            rows,
            lists_equal,
        )

    for num_layers, num_physical in [(43, 288), (61, 288)][: 1 if args.quick else 2]:
        window = torch.randint(
            0, 1 << 12, (args.window, num_layers, num_physical), dtype=torch.int32
        )
        p2l = torch.randint(0, num_logical, (num_layers, num_physical))
        p2l[:, -4:] = -1
        shape = f"W={args.window} L={num_layers} P={num_physical}"
        compare(
            "rearrange logical load",
            shape,
            lambda w=window, m=p2l: stock_logical_expert_load(w, m, num_logical),
            lambda w=window, m=p2l: _logical_expert_load(w, m, num_logical),
            args.repeats,
            rows,
            lambda x, y: torch.testing.assert_close(x, y, rtol=0, atol=0),
        )
        index_mib = args.window * num_layers * num_physical * 8 / 2**20
        print(
            f"{'  scatter index size':<28} {shape:<34} {index_mib:>8.1f}MiB "
            f"{num_layers * num_physical * 8 / 2**20:>8.2f}MiB"
        )
        rows[-1]["stock_index_mib"] = round(index_mib, 1)
        rows[-1]["new_index_mib"] = round(num_layers * num_physical * 8 / 2**20, 3)

    record = {
        "benchmark": "eplb_host_planning",
        "torch": torch.__version__,
        "numpy": np.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "repeats": args.repeats,
        "statistic": "median wall ms",
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
