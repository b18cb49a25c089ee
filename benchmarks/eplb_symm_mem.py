# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Benchmark the symm_mem EPLB communicator against torch_gloo.

Moves DeepSeek-V4-Flash-like EPLB traffic (43 MoE layers, 256 logical experts,
288 physical slots, MegaMoE-like per-expert tensors scaled down) through vLLM's
``rearrange_expert_weights_inplace`` on gloo ranks, and reports in one run:

- per-layer time and GB/s for torch_gloo, symm_mem (single buffer) and
  symm_mem (double buffer), end to end (planning, local moves, transfer,
  buffer -> weights) and for the transfer alone (``communicator.execute()``);
- symm_mem transfer throughput as a fraction of a plain memcpy of the same
  bytes on the same machine (all ranks copying at once; one bulk copy per
  layer, and one copy per (row, tensor) as symm_mem issues them).

On CPU the symmetric memory is host shared memory (/dev/shm files mapped by
every rank), the same provider the CPU tests use. ``--device cuda`` uses the
CUDA symmetric-memory provider and also measures the raw peer-copy bandwidth.

Run with the patched vLLM importable: in scripts/test's environment (the built
wheel is installed there), or with a patched source tree on PYTHONPATH::

    VLLM_TARGET_DEVICE=cpu <test-env>/bin/python benchmarks/eplb_symm_mem.py
"""

import argparse
import contextlib
import datetime
import json
import os
import platform
import socket
import sys
import tempfile
import time
import uuid
from unittest import mock

if "cuda" not in sys.argv:
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from vllm.distributed.eplb.eplb_communicator import (  # noqa: E402
    TorchDistGlooStagedEplbCommunicator,
)
from vllm.distributed.eplb.policy.default import DefaultEplbPolicy  # noqa: E402
from vllm.distributed.eplb.rebalance_execute import (  # noqa: E402
    rearrange_expert_weights_inplace,
)
from vllm.distributed.eplb.symm_mem_communicator import (  # noqa: E402
    CudaSymmetricMemoryProvider,
    PeerMemoryProvider,
    SymmMemEplbCommunicator,
)

NUM_LAYERS = 43
NUM_LOGICAL = 256
NUM_PHYSICAL = 288
# MegaMoE exposes every non-shared parameter as a (num_local, -1) byte row:
# fp4 w13 (2 x intermediate x hidden / 2), fp4 w2, and ue8m0 scales (1/32).
TENSOR_FRACTIONS = {"w13": 2 / 3, "w13_scale": 2 / 3 / 32, "w2": 1 / 3, "w2_s": 1 / 96}
DSV4_FLASH_EXPERT_BYTES = 3 * 2048 * 4096 // 2  # ~12.6 MB incl. scales


class ShmProvider(PeerMemoryProvider):
    """Host shared memory as "symmetric memory" (as in the CPU tests)."""

    def __init__(self, group):
        self._group = group

    def check_peer_access(self, device):
        pass

    def allocate(self, nbytes, device):
        self._path = f"/dev/shm/vllm-eplb-bench-{uuid.uuid4().hex}"
        with open(self._path, "wb") as f:
            f.truncate(nbytes)
        return torch.from_file(self._path, shared=True, size=nbytes, dtype=torch.uint8)

    def map_peers(self, local):
        paths = [None] * self._group.size()
        dist.all_gather_object(paths, self._path, group=self._group)
        peers = [
            local
            if r == self._group.rank()
            else torch.from_file(p, shared=True, size=local.numel(), dtype=torch.uint8)
            for r, p in enumerate(paths)
        ]
        dist.barrier(group=self._group)
        os.unlink(self._path)
        return peers


class _NoopStream:
    def synchronize(self):
        pass


def _row_sizes(expert_bytes: int) -> list[int]:
    sizes = [
        max(16, int(expert_bytes * f)) // 16 * 16 for f in TENSOR_FRACTIONS.values()
    ]
    return sizes


def _placements(world_size: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    old = torch.arange(NUM_PHYSICAL).remainder(NUM_LOGICAL)
    old = old.expand(NUM_LAYERS, -1).contiguous()
    rng = np.random.default_rng(seed)
    load = torch.from_numpy(rng.pareto(1.0, (NUM_LAYERS, NUM_LOGICAL)) + 0.01)
    new = DefaultEplbPolicy.rebalance_experts(
        load, NUM_PHYSICAL, 1, 1, world_size, old
    ).to(torch.int64)
    return old.numpy(), new.numpy()


def _remote_rows(old: np.ndarray, new: np.ndarray, world_size: int) -> np.ndarray:
    """(layers, ranks): rows each rank receives from a peer (one per expert
    it lacks; extra local replicas are duplicated locally)."""
    n = NUM_PHYSICAL // world_size
    out = np.zeros((old.shape[0], world_size), dtype=np.int64)
    for layer in range(old.shape[0]):
        for r in range(world_size):
            o, w = old[layer, r * n : (r + 1) * n], new[layer, r * n : (r + 1) * n]
            out[layer, r] = len(set(w.tolist()) - set(o.tolist()))
    return out


def _fill_weights(weights, placement, rank, n, first_layer=0):
    for layer, tensors in enumerate(weights, start=first_layer):
        experts = torch.from_numpy(placement[layer, rank * n : (rank + 1) * n])
        for t_idx, w in enumerate(tensors):
            value = (experts * 7 + layer * 31 + t_idx) % 251
            w.copy_(value.to(torch.uint8)[:, None].expand_as(w))


def _max_over_ranks(value: float, group) -> float:
    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _rank_main(rank, world_size, port, args, out_path):
    torch.set_num_threads(1)
    cuda = args.device == "cuda"
    if cuda:
        torch.accelerator.set_device_index(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if cuda else "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world_size,
        device_id=device if cuda else None,
    )
    group = dist.new_group(backend="gloo")
    n = NUM_PHYSICAL // world_size
    row_sizes = _row_sizes(args.expert_kib * 1024)
    old, new = _placements(world_size, args.seed)
    remote = _remote_rows(old, new, world_size)
    back = _remote_rows(new, old, world_size)
    row_bytes = sum(row_sizes)
    weights = [
        [torch.empty((n, s), dtype=torch.uint8, device=device) for s in row_sizes]
        for _ in range(NUM_LAYERS)
    ]

    def sync():
        if cuda:
            torch.accelerator.synchronize()

    def make(backend):
        if backend == "torch_gloo":
            return TorchDistGlooStagedEplbCommunicator(cpu_group=group), [
                torch.empty_like(w) for w in weights[0]
            ]
        provider = (
            CudaSymmetricMemoryProvider(dist.group.WORLD, group)
            if cuda
            else ShmProvider(group)
        )
        comm = SymmMemEplbCommunicator(
            group, weights[0], provider, double_buffer=backend == "symm_mem_double"
        )
        return comm, None

    results = {}
    for backend in ("torch_gloo", "symm_mem_single", "symm_mem_double"):
        _fill_weights(weights, old, rank, n)
        comm, buffer = make(backend)
        exec_time = [0.0]
        execute = comm.execute

        def timed_execute(execute=execute, exec_time=exec_time):
            sync()
            start = time.perf_counter()
            execute()
            sync()
            exec_time[0] += time.perf_counter() - start

        comm.execute = timed_execute
        fence_time = [0.0]
        if backend != "torch_gloo":
            fence = comm._fence

            def timed_fence(name, fence=fence, fence_time=fence_time):
                start = time.perf_counter()
                fence(name)
                fence_time[0] += time.perf_counter() - start

            comm._fence = timed_fence
        stub = (
            mock.patch.object(
                torch.accelerator, "current_stream", lambda *a: _NoopStream()
            )
            if not cuda and backend == "torch_gloo"
            else contextlib.nullcontext()
        )
        totals, execs, fences, pushes = [], [], [], []
        with stub:
            for it in range(1 + args.iters):
                for src, dst in ((old, new), (new, old)):
                    exec_time[0] = fence_time[0] = 0.0
                    dist.barrier(group=group)
                    sync()
                    start = time.perf_counter()
                    rearrange_expert_weights_inplace(
                        torch.from_numpy(src),
                        torch.from_numpy(dst),
                        weights,
                        buffer,
                        group,
                        comm,
                    )
                    sync()
                    total = time.perf_counter() - start
                    if it > 0:  # the first round warms up (page faults, sockets)
                        totals.append(_max_over_ranks(total, group))
                        execs.append(_max_over_ranks(exec_time[0], group))
                        # Pushes alone: execute() minus the time in fences
                        # (which includes waiting for the slowest rank), per
                        # rank, then the slowest rank.
                        if backend != "torch_gloo":
                            fences.append(_max_over_ranks(fence_time[0], group))
                            pushes.append(
                                _max_over_ranks(exec_time[0] - fence_time[0], group)
                            )
        # The last pass moved the weights back to ``old``: check every byte.
        ok = True
        for layer in range(NUM_LAYERS):
            expected = [[torch.empty_like(w) for w in weights[layer]]]
            _fill_weights(expected, old, rank, n, first_layer=layer)
            ok &= all(torch.equal(a, b) for a, b in zip(weights[layer], expected[0]))
        ok = _max_over_ranks(0.0 if ok else 1.0, group) == 0.0
        del comm, expected
        results[backend] = {
            "total_s": totals,
            "execute_s": execs,
            "fence_s": fences,
            "push_s": pushes,
            "correct": ok,
        }

    # memcpy of the same bytes, all ranks at once: per layer one bulk copy of
    # the rows this rank receives, and the same rows one copy per (row, tensor).
    max_rows = int(max(remote.max(), back.max()))
    src = [
        torch.empty((max_rows, s), dtype=torch.uint8, device=device) for s in row_sizes
    ]
    dst = [torch.empty_like(t) for t in src]
    for t in src + dst:
        t.fill_(1)
    bulk_src = torch.empty(max_rows * row_bytes, dtype=torch.uint8, device=device)
    bulk_dst = torch.empty_like(bulk_src)
    bulk_src.fill_(1)
    bulk_dst.fill_(1)
    memcpy = {"bulk_s": [], "rowwise_s": []}
    for it in range(1 + args.iters):
        for counts in (remote, back):
            dist.barrier(group=group)
            start = time.perf_counter()
            for layer in range(NUM_LAYERS):
                k = int(counts[layer, rank]) * row_bytes
                bulk_dst[:k].copy_(bulk_src[:k])
            sync()
            bulk = time.perf_counter() - start
            dist.barrier(group=group)
            start = time.perf_counter()
            for layer in range(NUM_LAYERS):
                for j in range(int(counts[layer, rank])):
                    for s, d in zip(src, dst):
                        d[j].copy_(s[j], non_blocking=True)
            sync()
            rowwise = time.perf_counter() - start
            if it > 0:
                memcpy["bulk_s"].append(_max_over_ranks(bulk, group))
                memcpy["rowwise_s"].append(_max_over_ranks(rowwise, group))

    peer_copy_gbps = None
    if cuda and world_size >= 2:
        # Raw copy-engine bandwidth into a peer's symmetric buffer.
        provider = CudaSymmetricMemoryProvider(dist.group.WORLD, group)
        nbytes = 256 << 20
        local = provider.allocate(nbytes, device)
        peers = provider.map_peers(local)
        payload = torch.ones(nbytes, dtype=torch.uint8, device=device)
        peer = peers[(rank + 1) % world_size]
        for _ in range(3):
            peer.copy_(payload)
        sync()
        dist.barrier(group=group)
        start = time.perf_counter()
        for _ in range(10):
            peer.copy_(payload)
        sync()
        elapsed = _max_over_ranks(time.perf_counter() - start, group)
        peer_copy_gbps = 10 * nbytes * world_size / elapsed / 1e9
        dist.barrier(group=group)

    if rank == 0:
        summary = {
            "world_size": world_size,
            "local_experts_per_rank": n,
            "row_bytes_per_expert": row_bytes,
            "row_bytes_per_tensor": row_sizes,
            "remote_rows_per_rearrangement": [int(remote.sum()), int(back.sum())],
            "bytes_per_rearrangement": [
                int(remote.sum()) * row_bytes,
                int(back.sum()) * row_bytes,
            ],
            "backends": results,
            "memcpy": memcpy,
            "peer_copy_gbps": peer_copy_gbps,
        }
        with open(out_path, "w") as f:
            json.dump(summary, f)
    dist.barrier(group=group)
    dist.destroy_process_group()


def _summarize(raw: dict) -> dict:
    total_bytes = sum(raw["bytes_per_rearrangement"]) / 2  # mean per pass
    per = {}

    def stats(times):
        t = float(np.median(times))
        return t, total_bytes / t / 1e9

    for backend, r in raw["backends"].items():
        t_total, gbps_total = stats(r["total_s"])
        t_exec, gbps_exec = stats(r["execute_s"])
        t_push, gbps_push = stats(r["push_s"]) if r["push_s"] else (None, None)
        per[backend] = {
            "per_layer_ms": 1e3 * t_total / NUM_LAYERS,
            "gbps_end_to_end": gbps_total,
            "transfer_per_layer_ms": 1e3 * t_exec / NUM_LAYERS,
            "gbps_transfer": gbps_exec,
            "fence_per_layer_ms": (
                1e3 * float(np.median(r["fence_s"])) / NUM_LAYERS
                if r["fence_s"]
                else None
            ),
            "gbps_pushes": gbps_push,
            "rearrangement_s": t_total,
            "correct": r["correct"],
        }
    _, bulk_gbps = stats(raw["memcpy"]["bulk_s"])
    _, row_gbps = stats(raw["memcpy"]["rowwise_s"])
    ratios = {
        "memcpy_bulk_gbps": bulk_gbps,
        "memcpy_rowwise_gbps": row_gbps,
    }
    for backend in ("symm_mem_single", "symm_mem_double"):
        ratios[f"{backend}_transfer_vs_memcpy_bulk"] = (
            per[backend]["gbps_transfer"] / bulk_gbps
        )
        ratios[f"{backend}_transfer_vs_memcpy_rowwise"] = (
            per[backend]["gbps_transfer"] / row_gbps
        )
        ratios[f"{backend}_pushes_vs_memcpy_bulk"] = (
            per[backend]["gbps_pushes"] / bulk_gbps
        )
        ratios[f"{backend}_pushes_vs_memcpy_rowwise"] = (
            per[backend]["gbps_pushes"] / row_gbps
        )
        ratios[f"{backend}_vs_torch_gloo_end_to_end"] = (
            per["torch_gloo"]["per_layer_ms"] / per[backend]["per_layer_ms"]
        )
        ratios[f"{backend}_vs_torch_gloo_transfer"] = (
            per["torch_gloo"]["transfer_per_layer_ms"]
            / per[backend]["transfer_per_layer_ms"]
        )
    ratios["double_vs_single_transfer"] = (
        per["symm_mem_single"]["transfer_per_layer_ms"]
        / per["symm_mem_double"]["transfer_per_layer_ms"]
    )
    if raw["peer_copy_gbps"]:
        ratios["symm_mem_double_transfer_vs_peer_copy"] = (
            per["symm_mem_double"]["gbps_transfer"] / raw["peer_copy_gbps"]
        )
    return {"backends": per, "ratios": ratios}


def _fmt(value, width):
    return f"{value:{width}.2f}" if value is not None else f"{'-':>{width}}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument(
        "--expert-kib",
        type=int,
        default=128,
        help="bytes per expert (all tensors) in KiB; DSV4-Flash is ~12 MiB",
    )
    parser.add_argument("--iters", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--output",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)), "results", "eplb_symm_mem.json"
        ),
    )
    args = parser.parse_args()

    runs = {}
    for world_size in [int(w) for w in args.world_sizes.split(",")]:
        with tempfile.TemporaryDirectory() as tmp:
            out_path = os.path.join(tmp, "rank0.json")
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            mp.start_processes(
                _rank_main,
                args=(world_size, port, args, out_path),
                nprocs=world_size,
                start_method="fork" if args.device == "cpu" else "spawn",
            )
            with open(out_path) as f:
                raw = json.load(f)
        runs[str(world_size)] = {"raw": raw, **_summarize(raw)}

    print(
        f"\nEPLB expert-weight migration, {NUM_LAYERS} layers, {NUM_LOGICAL} logical "
        f"/ {NUM_PHYSICAL} physical experts, {args.expert_kib} KiB per expert "
        f"(DSV4-Flash: ~{DSV4_FLASH_EXPERT_BYTES / 2**20:.0f} MiB), "
        f"device={args.device}"
    )
    header = (
        f"{'ranks':>5} {'backend':<16} {'layer ms':>9} {'GB/s e2e':>9} "
        f"{'xfer ms':>8} {'GB/s xfer':>9} {'fence ms':>8} {'GB/s push':>9} "
        f"{'43-layer s':>10} {'exact':>5}"
    )
    print(header)
    for ws, run in runs.items():
        mb = sum(run["raw"]["bytes_per_rearrangement"]) / 2 / 1e6
        for backend, r in run["backends"].items():
            print(
                f"{ws:>5} {backend:<16} {r['per_layer_ms']:9.2f} "
                f"{r['gbps_end_to_end']:9.2f} {r['transfer_per_layer_ms']:8.2f} "
                f"{r['gbps_transfer']:9.2f} "
                f"{_fmt(r['fence_per_layer_ms'], 8)} {_fmt(r['gbps_pushes'], 9)} "
                f"{r['rearrangement_s']:10.3f} "
                f"{str(r['correct']):>5}"
            )
        ratios = run["ratios"]
        print(
            f"{ws:>5} moved {mb:.1f} MB per rearrangement; memcpy of the same bytes: "
            f"bulk {ratios['memcpy_bulk_gbps']:.2f} GB/s, "
            f"row-wise {ratios['memcpy_rowwise_gbps']:.2f} GB/s"
        )
        for key, value in ratios.items():
            if not key.startswith("memcpy"):
                print(f"{ws:>5}   {key:<44} {value:6.2f}")
        if args.device == "cpu":
            print(f"{ws:>5}   GPU: not measured on GPU")

    result = {
        "benchmark": "eplb_symm_mem",
        "command": " ".join(["python", *sys.argv]),
        "summary": headline(runs),
        "timestamp": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "machine": {
            "processor": platform.processor(),
            "cores": os.cpu_count(),
            "note": (
                "CPU only, not measured on GPU"
                if args.device == "cpu"
                else "CUDA symmetric memory"
            ),
        },
        "config": {
            "device": args.device,
            "num_layers": NUM_LAYERS,
            "num_logical_experts": NUM_LOGICAL,
            "num_physical_experts": NUM_PHYSICAL,
            "expert_kib": args.expert_kib,
            "iters": args.iters,
            "seed": args.seed,
            "time_statistic": "median over iters x 2 directions, max over ranks",
            "gbps_definition": "bytes received from peers by all ranks / time",
        },
        "runs": runs,
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as f:
        json.dump(result, f, indent=2)
    print(f"\nwrote {args.output}")


def headline(runs: dict) -> dict:
    """The numbers a PR description quotes, per world size."""
    out = {}
    for ws, run in runs.items():
        b = run["backends"]
        out[f"{ws} ranks: ms per layer, torch_gloo / single / double"] = " / ".join(
            f"{b[k]['per_layer_ms']:.1f}"
            for k in ("torch_gloo", "symm_mem_single", "symm_mem_double")
        )
        for key in (
            "symm_mem_single_vs_torch_gloo_transfer",
            "symm_mem_double_vs_torch_gloo_transfer",
            "symm_mem_single_pushes_vs_memcpy_bulk",
            "symm_mem_double_pushes_vs_memcpy_bulk",
            "symm_mem_double_transfer_vs_memcpy_bulk",
        ):
            if key in run["ratios"]:
                out[f"{ws} ranks: {key}"] = round(run["ratios"][key], 2)
    return out


if __name__ == "__main__":
    main()
