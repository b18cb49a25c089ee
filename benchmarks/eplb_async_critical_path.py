# SPDX-License-Identifier: Apache-2.0
# SPDX-FileCopyrightText: Copyright contributors to the vLLM project
"""Main-thread cost of async EPLB per decode step: vLLM 0.33.0 vs patched.

Drives the real ``EplbState`` (``add_model`` with a synthetic MoE model of
DeepSeek-V4-Flash-like shapes: 43 MoE layers, 256 logical experts, 288
physical slots) on gloo ranks through ordinary steps, a trigger step and a
full async migration, once against the unpatched 0.33.0 tree and once against
the patched tree, each in its own subprocess, and prints both side by side.

Per step it times ``EplbState.step()`` on the main thread (wall and thread
CPU time) and counts host-blocking ops issued by the main thread with the
instrument shared with the tests
(``tests/distributed/eplb/eplb_async_helpers.py`` of the patched tree).

The 0.33.0 async worker cannot run without an accelerator; its run gets
test-side seams only (a no-op stream object, CpuGpuEvent without device
events, no-op ``device_stream``), none of which touches the main-thread path
being measured.

Usage (in scripts/test's environment):
  python benchmarks/eplb_async_critical_path.py \
      [--base TREE] [--patched TREE] [--ranks 4] [--step-ms 20] [--staged-layers 4]

Without --base/--patched both trees are checked out from the stack repository
(.vstack/repo): the pinned base, and the base with patches/series applied.
"""

import argparse
import contextlib
import json
import os
import platform
import subprocess
import sys
import threading
import time

NUM_LAYERS = 43
NUM_LOGICAL = 256
NUM_PHYSICAL = 288
ORDINARY_STEPS = 30


def _percentile(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    idx = min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))
    return values[idx]


def _summary(times_s):
    ms = [t * 1e3 for t in times_s]
    return {
        "n": len(ms),
        "p50_ms": _percentile(ms, 50),
        "p99_ms": _percentile(ms, 99),
        "max_ms": max(ms) if ms else float("nan"),
    }


# ---------------------------------------------------------------------------
# Rank side (runs in the subprocess, one process per gloo rank)
# ---------------------------------------------------------------------------


def _install_base_cpu_seams():
    """Let the 0.33.0 async worker run without an accelerator."""
    import torch
    from vllm.distributed.eplb import (
        async_worker,
        eplb_communicator,
        eplb_state,
        eplb_utils,
        rebalance_execute,
    )

    class HostStream:
        def synchronize(self):
            pass  # host tensor ops are synchronous

    @contextlib.contextmanager
    def no_stream(stream):
        yield

    for mod in (async_worker, eplb_communicator, rebalance_execute, eplb_utils):
        mod.device_stream = no_stream

    def start_async_worker(state, is_profile=False):
        def target():
            try:
                async_worker.transfer_run_periodically(
                    state=state, stream=HostStream(), is_profile=is_profile
                )
            except Exception:
                import traceback

                traceback.print_exc()

        thread = threading.Thread(target=target, daemon=True)
        thread.start()
        return thread

    eplb_state.start_async_worker = start_async_worker

    def record(self, stream=None):
        if self._recorded.is_set():
            raise RuntimeError("record before wait")
        self._recorded.set()

    def wait(self, stream=None):
        self._recorded.wait()
        self._recorded.clear()

    eplb_utils.CpuGpuEvent.record = record
    eplb_utils.CpuGpuEvent.wait = wait
    del torch


def _rank_main(rank, args, port, out_path):
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    sys.path.insert(0, os.path.join(args.patched, "tests", "distributed", "eplb"))
    import torch
    from eplb_async_helpers import (
        FakeMoEModel,
        HostBlockingOpCounter,
        check_weights_match_maps,
        init_eplb_groups,
        skewed_load,
    )

    torch.set_num_threads(1)
    if args.variant == "base":
        _install_base_cpu_seams()
    init_eplb_groups(rank, args.ranks, port)

    from types import SimpleNamespace

    from vllm.config import ParallelConfig
    from vllm.config.parallel import EPLBConfig
    from vllm.distributed.eplb.eplb_state import EplbState

    model = FakeMoEModel(
        NUM_LAYERS, NUM_LOGICAL, NUM_PHYSICAL, args.ranks, rank, row_scale=4
    )
    kwargs = dict(
        window_size=8,
        step_interval=100_000,
        num_redundant_experts=NUM_PHYSICAL - NUM_LOGICAL,
        use_async=True,
        communicator="torch_gloo",
    )
    if args.variant == "patched":
        kwargs["async_staged_layers"] = args.staged_layers
    parallel_config = ParallelConfig()
    parallel_config.eplb_config = EPLBConfig(**kwargs)
    state = EplbState(parallel_config, torch.device("cpu"))
    state.add_model(model, SimpleNamespace(model="fake", compute_hash=lambda: "f"))
    state.start_async_loop()
    ms = next(iter(state.model_states.values()))

    counter = HostBlockingOpCounter()
    counter.install()
    records = []

    def timed_step(phase):
        in_flight = ms.rebalanced
        before = ms.physical_to_logical_map.clone()
        with counter.counting():
            # Timed inside the counting region so that entering the mode is
            # not part of the measurement (its per-op overhead still is, for
            # both trees alike).
            wall0, cpu0 = time.perf_counter(), time.thread_time()
            state.step()
            wall, cpu = time.perf_counter() - wall0, time.thread_time() - cpu0
        applied = int((ms.physical_to_logical_map != before).any(dim=1).sum().item())
        records.append(
            {
                "phase": phase,
                "wall_s": wall,
                "cpu_s": cpu,
                "in_flight": in_flight,
                "layers_applied": applied,
                "blocking": dict(counter.take()),
            }
        )
        time.sleep(args.step_ms[0] / 1e3)  # the forward pass of a decode step

    # Line the ranks up so that start-up skew does not land in the trigger
    # step's all_reduce (ordinary steps have no collective to absorb it).
    torch.distributed.barrier()
    for _ in range(ORDINARY_STEPS):
        timed_step("ordinary")
    for migration in range(args.migrations):
        # Line the ranks up so that skew does not land in the trigger step's
        # all_reduce (ordinary steps have no collective to absorb it).
        torch.distributed.barrier()
        ms.expert_load_window.copy_(
            skewed_load(
                NUM_LAYERS, NUM_PHYSICAL, 7 + migration, state.expert_load_window_size
            )
        )
        state.expert_rearrangement_step = state.expert_rearrangement_step_interval - 1
        timed_step("trigger")
        for _ in range(2000):
            timed_step("migration")
            if not ms.rebalanced:
                break
        else:
            raise RuntimeError("migration did not finish")
        for _ in range(ORDINARY_STEPS):
            timed_step("ordinary")
    counter.uninstall()
    check_weights_match_maps(model, ms, rank)
    final_map = ms.physical_to_logical_map.clone()
    # Every rank's steps are samples: each rank's main thread is on the
    # critical path of the step (the slowest one sets the pace).
    torch.save({"records": records, "final_map": final_map}, f"{out_path}.{rank}")
    torch.distributed.barrier()


def _run_variant(args):
    import torch.multiprocessing as mp

    sys.path.insert(0, os.path.join(args.patched, "tests", "distributed", "eplb"))
    from eplb_async_helpers import free_port

    mp.start_processes(
        _rank_main,
        args=(args, free_port(), args.out),
        nprocs=args.ranks,
        start_method="spawn",
    )


# ---------------------------------------------------------------------------
# Orchestrator
# ---------------------------------------------------------------------------


def _analyse(records):
    ordinary = [r for r in records if r["phase"] == "ordinary"]
    migration = [r for r in records if r["phase"] == "migration"]
    trigger = [r for r in records if r["phase"] == "trigger"]
    apply_steps = [r for r in migration if r["layers_applied"]]

    def blocking_per_step(rs):
        totals = [sum(r["blocking"].values()) for r in rs]
        kinds = {}
        for r in rs:
            for k, v in r["blocking"].items():
                kinds[k] = kinds.get(k, 0) + v
        return {
            "max_per_step": max(totals) if totals else 0,
            "mean_per_step": sum(totals) / len(totals) if totals else 0.0,
            "by_kind_total": kinds,
        }

    return {
        "ordinary_wall": _summary([r["wall_s"] for r in ordinary]),
        "migration_wall": _summary([r["wall_s"] for r in migration]),
        "migration_cpu": _summary([r["cpu_s"] for r in migration]),
        "apply_step_wall": _summary([r["wall_s"] for r in apply_steps]),
        "trigger_wall_ms": max(r["wall_s"] for r in trigger) * 1e3 if trigger else None,
        # Per migration on one rank (the ranks step together); one trigger
        # step per migration and rank.
        "migrations_x_ranks": len(trigger),
        "migration_steps_in_flight": len(migration) / max(1, len(trigger)),
        "migration_steps_applying": len(apply_steps) / max(1, len(trigger)),
        "max_layers_per_step": max(
            (r["layers_applied"] for r in apply_steps), default=0
        ),
        "blocking_ordinary": blocking_per_step(ordinary),
        "blocking_migration": blocking_per_step(migration),
        "blocking_trigger": blocking_per_step(trigger),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", help="unpatched vLLM source tree")
    parser.add_argument("--patched", help="patched vLLM source tree")
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument(
        "--step-ms",
        type=float,
        nargs="+",
        default=[50.0, 150.0],
        help="simulated forward time per decode step; one run per value",
    )
    parser.add_argument("--staged-layers", type=int, default=4)
    parser.add_argument(
        "--migrations",
        type=int,
        default=3,
        help="full migrations per run (different load windows); more samples",
    )
    parser.add_argument(
        "--json",
        default=os.path.join(
            os.path.dirname(os.path.abspath(__file__)),
            "results",
            "eplb_async_critical_path.json",
        ),
    )
    parser.add_argument(
        "--variant", choices=["base", "patched"], help=argparse.SUPPRESS
    )
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.variant:
        _run_variant(args)
        return

    with contextlib.ExitStack() as trees:
        if not (args.base and args.patched):
            base, patched = _stack_trees(trees)
            args.base, args.patched = args.base or base, args.patched or patched
        _main(args)


def _stack_trees(stack: contextlib.ExitStack) -> tuple[str, str]:
    """Worktrees of the pinned base and of the applied series, from vstack."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, os.path.join(root, "src"))
    from vstack import gitutil
    from vstack.base import ensure_base
    from vstack.config import load_project
    from vstack.export import applied_tip
    from vstack.series import series_paths

    project = load_project(__import__("pathlib").Path(root))
    base = ensure_base(project)
    tip = applied_tip(project, base, series_paths(project.patches_dir))
    trees = [
        str(stack.enter_context(gitutil.temp_worktree(project.repo, rev, project.cache)))
        for rev in (base.commit, tip)
    ]
    return trees[0], trees[1]


def _main(args):
    import torch

    runs = []
    for step_ms in args.step_ms:
        runs.append(_compare(args, step_ms, torch))
    report = {
        "command": " ".join(["python"] + sys.argv),
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {
            "processor": platform.processor(),
            "cores": os.cpu_count(),
            "note": "CPU only, not measured on GPU; 2-core VM shared with other "
            "jobs; gloo weight transfers, not NVLink",
        },
        "summary": _headline(runs),
        "runs": runs,
    }
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(report, f, indent=2)
    print(f"wrote {args.json}")


def _headline(runs):
    """Headline numbers per simulated step time, 0.33.0 -> patched."""
    out = {}
    for run in runs:
        b, p = run["results"]["base"], run["results"]["patched"]
        tag = f"{run['shapes']['step_ms']:g} ms/step"
        out[f"{tag}: migration step p99 ms (0.33.0 / patched)"] = (
            f"{b['migration_wall']['p99_ms']:.2f} / {p['migration_wall']['p99_ms']:.2f}"
            f" ({run['migration_p99_ratio']:.1f}x)"
        )
        out[f"{tag}: host-blocking ops per migration step, max"] = (
            f"{b['blocking_migration']['max_per_step']} / "
            f"{p['blocking_migration']['max_per_step']}"
        )
        out[f"{tag}: steps applying layers per migration (43 layers)"] = (
            f"{b['migration_steps_applying']:.1f} / {p['migration_steps_applying']:.1f}"
        )
        out[f"{tag}: final maps identical"] = run["final_maps_identical"]
    return out


def _compare(args, step_ms, torch):
    results = {}
    for variant, tree in (("base", args.base), ("patched", args.patched)):
        out = f"/tmp/eplb_async_critical_path_{variant}_{os.getpid()}.pt"
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            "--variant",
            variant,
            "--out",
            out,
            "--base",
            args.base,
            "--patched",
            args.patched,
            "--ranks",
            str(args.ranks),
            "--step-ms",
            str(step_ms),
            "--staged-layers",
            str(args.staged_layers),
            "--migrations",
            str(args.migrations),
        ]
        env = dict(os.environ, PYTHONPATH=tree, VLLM_TARGET_DEVICE="cpu")
        print(f"running {variant} ({tree}) ...", flush=True)
        start = time.monotonic()
        subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL)
        records, final_map = [], None
        for rank in range(args.ranks):
            data = torch.load(f"{out}.{rank}", weights_only=False)
            os.remove(f"{out}.{rank}")
            records += data["records"]
            final_map = data["final_map"] if final_map is None else final_map
        results[variant] = _analyse(records)
        results[variant]["final_map"] = final_map
        results[variant]["run_s"] = time.monotonic() - start

    same_map = bool(
        torch.equal(
            results["base"].pop("final_map"), results["patched"].pop("final_map")
        )
    )
    b, p = results["base"], results["patched"]

    def fmt(x):
        return f"{x:.3f}" if isinstance(x, float) else str(x)

    rows = [
        (
            "ordinary step p50 ms",
            b["ordinary_wall"]["p50_ms"],
            p["ordinary_wall"]["p50_ms"],
        ),
        (
            "ordinary step p99 ms",
            b["ordinary_wall"]["p99_ms"],
            p["ordinary_wall"]["p99_ms"],
        ),
        (
            "ordinary step max ms",
            b["ordinary_wall"]["max_ms"],
            p["ordinary_wall"]["max_ms"],
        ),
        (
            "migration step p50 ms",
            b["migration_wall"]["p50_ms"],
            p["migration_wall"]["p50_ms"],
        ),
        (
            "migration step p99 ms",
            b["migration_wall"]["p99_ms"],
            p["migration_wall"]["p99_ms"],
        ),
        (
            "migration step max ms",
            b["migration_wall"]["max_ms"],
            p["migration_wall"]["max_ms"],
        ),
        (
            "migration step p99 CPU ms",
            b["migration_cpu"]["p99_ms"],
            p["migration_cpu"]["p99_ms"],
        ),
        (
            "applying step p99 ms",
            b["apply_step_wall"]["p99_ms"],
            p["apply_step_wall"]["p99_ms"],
        ),
        ("trigger step ms", b["trigger_wall_ms"], p["trigger_wall_ms"]),
        (
            "steps with migration in flight",
            b["migration_steps_in_flight"],
            p["migration_steps_in_flight"],
        ),
        (
            "steps applying layers",
            b["migration_steps_applying"],
            p["migration_steps_applying"],
        ),
        (
            "max layers applied in one step",
            b["max_layers_per_step"],
            p["max_layers_per_step"],
        ),
        (
            "blocking ops / ordinary step (max)",
            b["blocking_ordinary"]["max_per_step"],
            p["blocking_ordinary"]["max_per_step"],
        ),
        (
            "blocking ops / migration step (max)",
            b["blocking_migration"]["max_per_step"],
            p["blocking_migration"]["max_per_step"],
        ),
        (
            "blocking ops / migration step (mean)",
            b["blocking_migration"]["mean_per_step"],
            p["blocking_migration"]["mean_per_step"],
        ),
        (
            "blocking ops on trigger step",
            b["blocking_trigger"]["max_per_step"],
            p["blocking_trigger"]["max_per_step"],
        ),
    ]
    width = max(len(r[0]) for r in rows)
    print(
        f"\nEPLB async critical path: L={NUM_LAYERS} NLOG={NUM_LOGICAL} "
        f"P={NUM_PHYSICAL}, {args.ranks} gloo ranks, {step_ms} ms/step "
        f"simulated forward, staged layers {args.staged_layers} (patched)"
    )
    print(f"{'metric':<{width}}  {'0.33.0':>10}  {'patched':>10}  {'ratio':>8}")
    for name, bv, pv in rows:
        ratio = ""
        if isinstance(bv, (int, float)) and isinstance(pv, (int, float)) and pv:
            ratio = f"{bv / pv:.1f}x"
        print(f"{name:<{width}}  {fmt(bv):>10}  {fmt(pv):>10}  {ratio:>8}")
    print("blocking ops by kind, migration steps (total):")
    print(f"  0.33.0 : {b['blocking_migration']['by_kind_total']}")
    print(f"  patched: {p['blocking_migration']['by_kind_total']}")
    print(f"final maps identical: {same_map}")

    p99_ratio = b["migration_wall"]["p99_ms"] / p["migration_wall"]["p99_ms"]
    print(f"migration p99 ratio {p99_ratio:.1f}x")
    return {
        "shapes": {
            "layers": NUM_LAYERS,
            "logical": NUM_LOGICAL,
            "physical": NUM_PHYSICAL,
            "ranks": args.ranks,
            "step_ms": step_ms,
            "staged_layers": args.staged_layers,
        },
        "results": results,
        "migration_p99_ratio": p99_ratio,
        "final_maps_identical": same_map,
        "targets": {
            "zero_blocking_ops_per_step": (
                p["blocking_migration"]["max_per_step"] == 0
                and p["blocking_ordinary"]["max_per_step"] == 0
            ),
            "migration_p99_30x": p99_ratio >= 30,
            "fewer_migration_steps_than_layers": (
                p["migration_steps_applying"] < NUM_LAYERS
            ),
        },
    }


if __name__ == "__main__":
    main()
