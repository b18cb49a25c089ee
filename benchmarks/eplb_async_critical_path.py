# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Async EPLB on the decode critical path: stock vLLM vs this tree, one run.

Each implementation runs in its own process group (PYTHONPATH pointing at its
vLLM tree) of forked CPU gloo ranks. Every rank drives the real EplbState and
async worker in a decode loop whose "forward" holds the GIL for Python work
(input preparation and sampling bookkeeping as real Python loops) and runs
torch ops, with one collective per step as decode has. By default nothing
sleeps; --device-ms adds the GPU's share of a step, during which the host
waits with the GIL released, as it does in a CUDA sync. --cpu-group-latency-ms
models EP ranks on several nodes (vLLM #57883): every operation on the EP and
EPLB groups' gloo CPU groups (a collective, cpu_all_reduce_, a p2p batch) first
waits that long with the GIL released, as a cross-node round trip does.

Per rank it reports the decode step time (forward + EplbState.step() + the
step's collective) in steady state and during migrations, the collectives the
main thread issues inside EplbState.step() per migration step, the steps per
migration cycle, and the bytes EPLB holds or allocates on the weights' device.

Usage (trees: a stock vLLM 0.34.0 source tree and the applied series):
    python benchmarks/eplb_async_critical_path.py \
        --stock-tree ../stock-0.34.0 --patched-tree .vstack/repo \
        [--staged 1,5,43] [--device-ms 20 --requests 512] \
        [--cpu-group-latency-ms 2]
"""

import argparse
import contextlib
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
RESULTS = os.path.join(HERE, "results", "eplb_async_critical_path.json")


def _percentile(values, q):
    values = sorted(values)
    if not values:
        return float("nan")
    idx = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[idx]


def _summary(values):
    return {
        "n": len(values),
        "p50_ms": 1e3 * _percentile(values, 50),
        "p99_ms": 1e3 * _percentile(values, 99),
        "max_ms": 1e3 * max(values) if values else float("nan"),
    }


# ---------------------------------------------------------------------------
# Rank side (runs under the implementation's PYTHONPATH)
# ---------------------------------------------------------------------------


_DEVICE_IDLE = threading.Event()  # never set: wait() is a GIL-free timed wait


def _forward(x, w, num_requests, device_s):
    """One decode step: Python input prep, torch ops, Python sampling."""
    import torch

    # Input preparation: per-request bookkeeping in Python (holds the GIL).
    positions = []
    for req in range(num_requests):
        seq = [req * 7 + i for i in range(24)]
        positions.append(sum(seq) % 4096)
    ids = torch.tensor(positions, dtype=torch.int64)
    # "Model": a few small torch ops.
    h = x + ids[: x.shape[0]].unsqueeze(1).to(x.dtype) * 1e-6
    for _ in range(4):
        h = torch.tanh(h @ w)
    if device_s:
        # The GPU running the step: the host blocks in the sync before
        # sampling with the GIL released (as torch.accelerator.synchronize()
        # and .item() do), and its core is free for other threads.
        _DEVICE_IDLE.wait(device_s)
    # Sampling bookkeeping.
    probs = torch.softmax(h.sum(dim=1), dim=0)
    out = probs.argmax().item()
    stops = {}
    for req in range(num_requests):
        stops[req] = (out + req) % 13 == 0
    return h, stops


class _MainThreadCollectives:
    def __init__(self):
        import torch.distributed as dist
        import vllm.distributed.eplb.eplb_state as eplb_state_module
        from vllm.distributed.parallel_state import GroupCoordinator

        self.count = 0
        self.active = False
        self.thread = threading.current_thread()
        targets = [
            (dist, n)
            for n in ("all_reduce", "barrier", "broadcast", "all_gather", "send")
        ]
        targets += [
            (dist, "recv"),
            (dist, "batch_isend_irecv"),
            (eplb_state_module, "all_reduce"),
            (GroupCoordinator, "cpu_all_reduce_"),
        ]
        for owner, name in targets:
            setattr(owner, name, self._wrap(getattr(owner, name)))

    def _wrap(self, fn):
        def wrapper(*args, **kwargs):
            if self.active and threading.current_thread() is self.thread:
                self.count += 1
            return fn(*args, **kwargs)

        return wrapper


def _add_cpu_group_latency(seconds):
    """Every operation on the EP/EPLB gloo CPU groups waits ``seconds`` first,
    with the GIL released, in stock and patched trees alike."""
    import torch.distributed as dist
    import vllm.distributed.eplb.eplb_communicator as communicator
    import vllm.distributed.eplb.eplb_state as eplb_state
    import vllm.distributed.parallel_state as parallel_state
    import vllm.distributed.utils as dist_utils

    def cpu_groups():
        return {
            id(g.cpu_group)
            for g in (parallel_state._EP, parallel_state._EPLB)
            if g is not None
        }

    def on_cpu_group(args, kwargs):
        group = kwargs.get("group")
        if group is None:
            group = next((a for a in args if isinstance(a, dist.ProcessGroup)), None)
        if group is None and args and isinstance(args[0], list):  # P2POps
            group = next((op.group for op in args[0]), None)
        return group is not None and id(group) in cpu_groups()

    def delayed(fn, always=False):
        def wrapper(*args, **kwargs):
            if always or on_cpu_group(args, kwargs):
                _DEVICE_IDLE.wait(seconds)
            return fn(*args, **kwargs)

        return wrapper

    # cpu_all_reduce_ always runs on a CPU group; modules imported it by name.
    real_cpu_all_reduce = dist_utils.cpu_all_reduce_
    for module in (
        sys.modules.get("vllm.distributed.eplb.async_worker"),
        dist_utils,
        parallel_state,
    ):
        if module is not None and getattr(module, "cpu_all_reduce_", None) is (
            real_cpu_all_reduce
        ):
            module.cpu_all_reduce_ = delayed(real_cpu_all_reduce, always=True)
    dist.all_reduce = delayed(dist.all_reduce)
    eplb_state.all_reduce = delayed(eplb_state.all_reduce)
    communicator.batch_isend_irecv = delayed(communicator.batch_isend_irecv)


def _rank_scenario(rank, world_size, cfg):
    import torch
    import torch.distributed as dist
    from eplb_async_helpers import (
        FakeMoEModel,
        arm_trigger,
        make_eplb_state,
        model_state,
    )
    from torch.utils._python_dispatch import TorchDispatchMode

    class _AllocBytes(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.bytes = 0
            self.thread = threading.current_thread()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            from torch.utils._pytree import tree_leaves

            out = func(*args, **(kwargs or {}))
            if threading.current_thread() is self.thread:
                inputs = {
                    t.untyped_storage().data_ptr()
                    for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)
                }
                for t in tree_leaves(out):
                    if (
                        isinstance(t, torch.Tensor)
                        and t.device.type == "cpu"
                        and t.untyped_storage().data_ptr() not in inputs
                    ):
                        self.bytes += t.untyped_storage().nbytes()
            return out

    torch.manual_seed(0)
    specs = ((cfg["row_elems"], torch.bfloat16), (cfg["row_elems"] // 2, torch.uint8))
    model = FakeMoEModel(
        world_size,
        rank,
        num_layers=cfg["layers"],
        num_logical=cfg["logical"],
        num_physical=cfg["physical"],
        specs=specs,
    )
    kwargs = {}
    if cfg["staged_layers"] is not None:
        kwargs["async_staged_layers"] = cfg["staged_layers"]
    import vllm.distributed.eplb.async_worker  # noqa: F401

    if cfg["cpu_group_latency_ms"]:
        _add_cpu_group_latency(cfg["cpu_group_latency_ms"] / 1e3)
    state = make_eplb_state(model, use_async=True, **kwargs)
    ms = model_state(state)
    eplb_bytes = sum(b.numel() * b.element_size() for b in ms.expert_buffer)
    for slot in getattr(ms, "staging_slots", [])[1:]:
        eplb_bytes += sum(b.numel() * b.element_size() for b in slot.buffers)
    state.start_async_loop()
    counter = _MainThreadCollectives()
    x = torch.randn(64, 128)
    w = torch.randn(128, 128) * 0.05
    steady, migration, collectives, cycles, alloc = [], [], [], [], 0
    eplb_step = []  # EplbState.step() alone, during migrations
    apply_steps = []  # per cycle: steps at which some layer switched

    def decode_step(record, track_alloc=False):
        t0 = time.perf_counter()
        _forward(x, w, cfg["requests"], cfg["device_ms"] / 1e3)
        counter.active, counter.count = True, 0
        # The dispatch mode slows every op, so it runs only in the untimed
        # allocation cycle.
        mode = _AllocBytes() if track_alloc else contextlib.nullcontext()
        t_step = time.perf_counter()
        with mode:
            state.step()
        step_s = time.perf_counter() - t_step
        counter.active = False
        done = torch.tensor([int(ms.rebalanced)])
        dist.all_reduce(done)  # decode is collective: one per step
        elapsed = time.perf_counter() - t0
        if record is not None:
            record.append(elapsed)
        if record is migration:
            eplb_step.append(step_s)
        return int(done), counter.count, getattr(mode, "bytes", 0)

    for _ in range(cfg["warmup"]):
        decode_step(None)
    # Timed cycles, then one untimed cycle that counts allocations.
    for cycle in range(cfg["cycles"] + 1):
        track_alloc = cycle == cfg["cycles"]
        for _ in range(cfg["steady_steps"]):
            decode_step(steady)
        arm_trigger(state, seed=100 + cycle)
        decode_step(None)  # the trigger step: load all_reduce + rearrange()
        steps, switched = 1, 0
        prev = ms.physical_to_logical_map.clone()
        while True:
            busy, count, nbytes = decode_step(
                None if track_alloc else migration, track_alloc
            )
            # Outside the timed step: did a layer switch on this step?
            if not torch.equal(prev, ms.physical_to_logical_map):
                switched += 1
                prev.copy_(ms.physical_to_logical_map)
            collectives.append(count)
            alloc = max(alloc, nbytes)
            steps += 1
            if busy == 0 or steps > 2000:
                break
        if not track_alloc:
            cycles.append(steps)
            apply_steps.append(switched)
    return {
        "steady": steady,
        "migration": migration,
        "eplb_step": eplb_step,
        "collectives_per_migration_step": sum(collectives) / max(1, len(collectives)),
        "steps_per_cycle": cycles,
        "apply_steps_per_cycle": apply_steps,
        "eplb_buffer_bytes": eplb_bytes,
        "max_step_alloc_bytes": alloc,
    }


def _run_impl(name, cfg, out_path):
    sys.path.insert(0, os.path.join(cfg["patched_tree"], "tests/distributed/eplb"))
    import vllm
    from eplb_ranks import run_ranks

    # Without the tests' collective-contract checker: it adds a round trip to
    # every collective it checks.
    results = run_ranks(
        cfg["ranks"], _rank_scenario, timeout_s=600, contract=False, cfg=cfg
    )
    with open(out_path, "w") as f:
        json.dump({"impl": name, "vllm": vllm.__file__, "ranks": results}, f)


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


def _omp_threads(ranks):
    return max(1, (os.cpu_count() or 1) // ranks)


def _launch(name, tree, staged_layers, args, tmp):
    cfg = {
        "ranks": args.ranks,
        "layers": args.layers,
        "logical": args.logical,
        "physical": args.physical,
        "row_elems": args.row_elems,
        "requests": args.requests,
        "device_ms": args.device_ms,
        "cpu_group_latency_ms": args.cpu_group_latency_ms,
        "warmup": args.warmup,
        "steady_steps": args.steady_steps,
        "cycles": args.cycles,
        "staged_layers": staged_layers,
        "patched_tree": os.path.abspath(args.patched_tree),
    }
    out = os.path.join(tmp, f"{name}.json")
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), VLLM_TARGET_DEVICE="cpu")
    # As vLLM's multiproc executor does for its workers: intra-op threads of
    # several ranks that oversubscribe the cores stall for tens of ms.
    env.setdefault("OMP_NUM_THREADS", str(_omp_threads(args.ranks)))
    code = (
        f"import json, sys; sys.path.insert(0, {HERE!r}); "
        "import eplb_async_critical_path as b; "
        f"b._run_impl({name!r}, json.loads({json.dumps(cfg)!r}), {out!r})"
    )
    # Run outside both trees, so only PYTHONPATH decides which vLLM loads.
    subprocess.run(
        [sys.executable, "-c", code], env=env, check=True, timeout=900, cwd=tmp
    )
    with open(out) as f:
        return json.load(f)


def _summary_rows(runs):
    """Per run, the worst rank's figures, patched runs also relative to stock."""

    def worst(run, key):
        return max(key(r) for r in run["ranks"])

    def mean_steps(r):
        return sum(r["steps_per_cycle"]) / len(r["steps_per_cycle"])

    stock = runs[0]
    rows = {}
    for run in runs:
        name = run["name"]
        p99 = worst(run, lambda r: r["migration"]["p99_ms"])
        steps = worst(run, mean_steps)
        vs = "" if run is stock else " ({:.2f}x stock)"
        rows[f"{name}: migration p99 / steady p99"] = "{:.2f}".format(
            worst(run, lambda r: r["p99_ratio"])
        )
        rows[f"{name}: migration step p99 ms"] = f"{p99:.1f}" + vs.format(
            p99 / worst(stock, lambda r: r["migration"]["p99_ms"])
        )
        rows[f"{name}: EplbState.step() p50/p99 ms, migration"] = (
            "{:.2f}/{:.2f}".format(
                worst(run, lambda r: r["eplb_step_in_migration"]["p50_ms"]),
                worst(run, lambda r: r["eplb_step_in_migration"]["p99_ms"]),
            )
        )
        rows[f"{name}: main-thread collectives per migration step"] = worst(
            run, lambda r: r["collectives_per_migration_step"]
        )
        rows[f"{name}: steps per cycle, mean"] = f"{steps:.1f}" + vs.format(
            steps / worst(stock, mean_steps)
        )
        rows[f"{name}: EPLB device bytes / bytes allocated per step"] = (
            f"{worst(run, lambda r: r['eplb_buffer_bytes'])} / "
            f"{worst(run, lambda r: r['max_step_alloc_bytes'])}"
        )
    return rows


def _print_table(report):
    def trio(summary, keys=("p50_ms", "p99_ms", "max_ms")):
        return "/".join(f"{summary[k]:.1f}" for k in keys)

    rows = [
        (
            "run",
            "rk",
            "steady p50/p99/max",
            "migration p50/p99/max",
            "p99 x",
            "step() p50/p99",
            "coll/step",
            "steps/cycle",
            "apply steps",
            "EPLB bytes",
            "step alloc B",
        )
    ]
    for run in report["runs"]:
        for r in run["ranks"]:
            rows.append(
                (
                    run["name"],
                    str(r["rank"]),
                    trio(r["steady"]),
                    trio(r["migration"]),
                    f"{r['p99_ratio']:.2f}",
                    trio(r["eplb_step_in_migration"], ("p50_ms", "p99_ms")),
                    f"{r['collectives_per_migration_step']:.2f}",
                    str(r["steps_per_cycle"]),
                    str(r["apply_steps_per_cycle"]),
                    str(r["eplb_buffer_bytes"]),
                    str(r["max_step_alloc_bytes"]),
                )
            )
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print(
            "  ".join(
                cell.ljust(w) for cell, w in zip(row, widths, strict=True)
            ).rstrip()
        )
    print("(times in ms; step() is EplbState.step() alone, during migrations)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--stock-tree", required=True, help="a vLLM tree at stock 0.34.0"
    )
    parser.add_argument(
        "--patched-tree",
        default=os.path.join(os.path.dirname(HERE), ".vstack", "repo"),
        help="a vLLM tree with the series applied (default: `vstack apply`'s "
        ".vstack/repo)",
    )
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--layers", type=int, default=43)
    parser.add_argument("--logical", type=int, default=12)
    parser.add_argument("--physical", type=int, default=16)
    parser.add_argument("--row-elems", type=int, default=256)
    parser.add_argument(
        "--requests",
        type=int,
        default=64,
        help="requests whose bookkeeping the forward does in Python (GIL held)",
    )
    parser.add_argument(
        "--device-ms",
        type=float,
        default=0.0,
        help="GPU time per step: the host waits with the GIL released "
        "(default 0: a host-bound step, the worst case for the async worker)",
    )
    parser.add_argument(
        "--cpu-group-latency-ms",
        type=float,
        default=0.0,
        help="added before every operation on the EP/EPLB gloo CPU groups: "
        "ranks on several nodes (default 0: one machine)",
    )
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--steady-steps", type=int, default=150)
    parser.add_argument("--cycles", type=int, default=2)
    parser.add_argument(
        "--staged",
        default=None,
        help="comma-separated async_staged_layers values for the patched "
        "tree (default: 1 and --layers)",
    )
    parser.add_argument("--out", default=RESULTS)
    args = parser.parse_args()
    for flag, tree in (
        ("--stock-tree", args.stock_tree),
        ("--patched-tree", args.patched_tree),
    ):
        if not os.path.isfile(
            os.path.join(tree, "vllm", "distributed", "eplb", "eplb_state.py")
        ):
            parser.error(
                f"{flag} {tree}: not a vLLM source tree (no vllm/distributed/eplb)"
            )
    import tempfile

    staged = [int(v) for v in (args.staged or f"1,{args.layers}").split(",")]
    runs = [("stock 0.34.0", args.stock_tree, None)]
    runs += [(f"patched, staged={n}", args.patched_tree, n) for n in staged]
    config = dict(vars(args), cpus=os.cpu_count())
    config["omp_num_threads"] = os.environ.get(
        "OMP_NUM_THREADS", _omp_threads(args.ranks)
    )
    report = {"config": config, "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i, (name, tree, staged_layers) in enumerate(runs):
            print(f"running {name} ...", flush=True)
            raw = _launch(f"run{i}", tree, staged_layers, args, tmp)
            ranks = []
            for rank, (status, value) in enumerate(raw["ranks"]):
                if status != "ok":
                    raise SystemExit(f"{name} rank {rank} failed: {value}")
                steady = _summary(value["steady"])
                migr = _summary(value["migration"])
                ranks.append(
                    {
                        "rank": rank,
                        "steady": steady,
                        "migration": migr,
                        "p99_ratio": migr["p99_ms"] / steady["p99_ms"],
                        "collectives_per_migration_step": value[
                            "collectives_per_migration_step"
                        ],
                        "steps_per_cycle": value["steps_per_cycle"],
                        "apply_steps_per_cycle": value["apply_steps_per_cycle"],
                        "eplb_step_in_migration": _summary(value["eplb_step"]),
                        "eplb_buffer_bytes": value["eplb_buffer_bytes"],
                        "max_step_alloc_bytes": value["max_step_alloc_bytes"],
                    }
                )
            print(f"  vllm loaded from {raw['vllm']}", flush=True)
            report["runs"].append({"name": name, "vllm": raw["vllm"], "ranks": ranks})
    report["summary"] = _summary_rows(report["runs"])
    report["command"] = " ".join(
        [os.path.basename(sys.executable), os.path.relpath(__file__), *sys.argv[1:]]
    )
    report["machine"] = {
        "cores": os.cpu_count(),
        "note": "CPU gloo ranks, not measured on GPU",
    }
    report["timestamp"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=2)
    _print_table(report)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
