"""py-spy's folded stacks of an agent process, sorted into the stages of an agent's round.

bench_profile.py records every profiled agent with `py-spy record --nonblocking --format raw
--threads`: one line per distinct stack, `thread (TID): NAME;frame;frame;... COUNT`, the root
first. A sample belongs to the innermost frame that names a stage (walking from the leaf up):
gRPC's `_write` under `RoundStream.send` is gRPC's own work, while `_digest_tensor` under
`parse_round` is a check. py-spy leaves out threads the OS shows sleeping; samples whose leaf
still waits are dropped too: epoll's select (a thread just woken is runnable there until it
gets a core, which on a loaded machine is most of its runnable time), a lock, and the disk:
they take time, not CPU. py-spy counts a thread blocked on the disk as busy, and without
--native its leaf is the Python function that made the call, so the checkpoint's functions
whose work is writing, fsyncing or unlinking files are dropped by name (measured alone, a
checkpoint's writer spends over nine tenths of its time there waiting, not computing;
bench_profile.py prints a checkpoint's CPU measured alone beside the table). A runnable thread
preempted elsewhere still counts where it stands (bench_profile.py prints how long the agents waited
for a core). Each thread's CPU time (from /proc) is then split over its stages by their share of its
busy samples. """

from __future__ import annotations

import collections
import re
from collections.abc import Iterable

# Stage of a frame, by the function name py-spy prints ("Class.method (file:line)"): the first
# rule that matches, in this order, wins for that frame.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("evaluation", ("evaluate (agent/phases/phase_two.py", "_evaluate_into")),
    ("checkpoint", ("save_checkpoint", "StateStore.")),
    ("outbox log", ("OutboxLog.",)),
    ("checks and digests", (
        "_digest_tensor", "_digest_head", "_finite (", "round_digest", "validate_header", "_check_header",
        "header_from_proto", "RoundLedger.judge", "._authenticate", ".admit", "caller_names",
        "AgentService._obey", "_admit")),
    ("receive and decode", (
        "tensor_from_parts", "_decode_round", "decode_round_message", "parse_round",
        "tolerant_parser", "_parse (", "_file_round", "StreamRounds",
        "Mailbox.put", "_admit_and_read", "_guard_stream", "RoundDecoder")),
    ("step (gradient and mixing)", (
        "RoundDriver.step", "DSGD.step", "GradientTracking.step", "loss_and_grad",
        "LocalObjective", " mix (", "FunctionalPerturbation", "MaskedPerturbation",
        "BatchSampler", "Dataset.batch", "check_inbox", "progress (efpsn/optimize/driver.py")),
    ("encode and send", (
        "encode_round", "message_to_proto", "tensor_to_proto", "make_header", "RoundStream.",
        "Peers.send_round", "Peers.put_round", "Peers.send ", "all_or_first_error",
        "RoundEncoder")),
    ("status (GetStatus)", ("GetStatus",)),
    ("round bookkeeping", (
        "RoundLink.", "Peers.", "Mailbox.", "RoundLedger.", "run_phase_two", "Replay.",
        "Outbox.", "settle", "Status")),
    ("gRPC internals", ("(grpc/", "cygrpc", "(grpc_", "_read_raw")),
    ("event loop (asyncio)", ("(asyncio/", "_asynciomodule", "selectmodule", "(selectors")),
)
OTHER_THREADS = "gRPC's own threads"
STAGES = (*(stage for stage, _ in RULES), "other", OTHER_THREADS)

# A sample whose innermost frames wait is idle (the thread uses no CPU there).
_IDLE = re.compile(r"^(epoll_wait|epoll_pwait|poll|ppoll|select|pselect6?|nanosleep|"
                   r"clock_nanosleep|PyThread_acquire_lock_timed|pthread_cond_(timed)?wait|"
                   r"sem_(timed|clock)?wait|do_futex_wait|__futex_abstimed_wait\w*|"
                   r"select_epoll_poll\w*|time_sleep|fsync|fdatasync|EpollSelector\.select) ")
# The checkpoint's file writes, fsyncs and removals (agent/state.py, shutil): a leaf there waits
# on the disk (py-spy sees no system call without --native).
_DISK = re.compile(r"^(_?write_new|write_all|_?fsync_dir|rmtree|_rmtree_safe_fd|_rmtree_unsafe) ")
POLLER = "(_poll_wrapper)"  # the name of grpc.aio's completion-queue thread
_THREAD = re.compile(r"^thread \((\d+)\)")


def stage_of(frames: list[str]) -> str | None:
    """The stage of one sample's stack (root first), or None when it is idle."""
    if any(_IDLE.match(frame) for frame in frames[-3:]) or (frames and _DISK.match(frames[-1])):
        return None
    for frame in reversed(frames):
        for stage, patterns in RULES:
            if any(p in frame for p in patterns):
                return stage
    return "other"


def top_frames(lines: Iterable[str], *, per_stage: int = 6) -> dict[str, list[tuple[str, int]]]:
    """Stage -> its most sampled (innermost project function | leaf frame) pairs: what inside a
    stage costs the most."""
    out: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        thread, *frames = stack.split(";")
        stage = stage_of(frames) if frames and count.isdigit() else None
        if stage is None:
            continue
        if POLLER in thread:
            stage = "gRPC internals"
        ours = [f for f in frames if "(agent/" in f or "(efpsn/" in f]
        where = ours[-1].split(" (")[0] if ours else "-"
        out[stage][f"{where} | {frames[-1].split(' (')[0][:40]}"] += int(count)
    return {stage: c.most_common(per_stage) for stage, c in out.items()}


def busy_samples(lines: Iterable[str]) -> dict[int, collections.Counter[str]]:
    """Thread id -> stage -> busy samples, from py-spy's raw (folded) output."""
    out: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in lines:
        stack, _, count = line.rstrip("\n").rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        match = _THREAD.match(frames[0])
        if match is None:
            continue
        stage = stage_of(frames[1:])
        if stage is not None and POLLER in frames[0]:
            stage = "gRPC internals"  # grpc.aio's poller thread: its work is C, under Thread.run
        if stage is not None:
            out[int(match.group(1))][stage] += int(count)
    return out


def split_cpu(samples: dict[int, collections.Counter[str]], thread_cpu: dict[int, float],
              process_cpu: float) -> dict[str, float]:
    """CPU seconds per stage: each sampled thread's CPU split by its busy samples' stages, and
    the CPU of every other thread (gRPC's C-core threads, which py-spy cannot see, gRPC's poller
    thread, seen only waiting, and threads that ended) as OTHER_THREADS."""
    out: collections.Counter[str] = collections.Counter()
    seen = 0.0
    for tid, stages in samples.items():
        cpu = thread_cpu.get(tid, 0.0)
        total = sum(stages.values())
        if total == 0:
            continue
        seen += cpu
        for stage, count in stages.items():
            out[stage] += cpu * count / total
    out[OTHER_THREADS] += max(0.0, process_cpu - seen)
    return dict(out)
