#!/usr/bin/env python3
"""Where one gavel process's CPU goes, from a `perf record` of a benchmark.

    perf record -F 997 -o perf.data -- target/release/gavel-bench run --only B4
    perf script -i perf.data -F comm,pid,ip,sym,dso > perf.txt
    python3 bench/scripts/perf_stages.py perf.txt PID

PID is the process to summarise: the first `gavel` process B4 starts is the
embedded one (`perf script --show-task-events | grep 'exec: gavel:'`).
Prints the share of that process's samples per thread kind and per kind of
code (the table under "Where the CPU of a settled item goes" in the README).
"""
import collections
import re
import sys

SCHED = {
    "finish_task_switch.isra.0", "_raw_spin_unlock_irqrestore", "_raw_spin_unlock_irq",
    "do_sched_yield", "__schedule", "schedule", "try_to_wake_up", "futex_wake", "futex_wait",
    "syscall", "do_syscall_64", "irqentry_exit_to_user_mode", "__GI___pthread_mutex_unlock_usercnt",
    "pthread_mutex_lock@@GLIBC_2.2.5", "<std::sys::sync::mutex::futex::Mutex>::lock_contended",
    "epoll_wait",
}
MALLOC = {
    "_int_malloc", "malloc", "_int_free", "cfree@GLIBC_2.2.5", "unlink_chunk.constprop.0",
    "malloc_consolidate", "realloc", "_int_realloc", "__libc_calloc", "calloc",
}
LINE = re.compile(r"\s*(.+?)\s+(\d+)\s+([0-9a-f]+)\s+(.*)\((.*)\)\s*$")


def kind(sym: str, dso: str) -> str:
    if sym in SCHED:
        return "scheduler: context switches, wake-ups, futexes"
    if sym in MALLOC:
        return "malloc/free"
    if sym.startswith("__mem"):
        return "memmove/memset/memcmp"
    if re.match(r"(sqlite3|pcache|wal|btree|vdbe|balance_|pager)", sym, re.I):
        return "SQLite's own code"
    if "kernel" in dso:
        return "kernel, other (file writes, fsync, page faults)"
    if "wasmtime" in sym or "perf-" in dso or sym == "[unknown]" or "pagemap" in sym:
        return "wasmtime: instantiation, reset, guest code"
    if any(z in sym for z in ("ZSTD", "HUF", "FSE")):
        return "zstd (snapshots)"
    if any(t in sym for t in ("tokio", "hyper", "axum", "flume", "futures", "sqlx")):
        return "tokio, hyper, axum, sqlx, channels"
    return "other"


def main() -> None:
    path, pid = sys.argv[1], sys.argv[2]
    threads, kinds, syms = collections.Counter(), collections.Counter(), collections.Counter()
    total = 0
    for line in open(path, errors="replace"):
        m = LINE.match(line)
        if not m or m.group(2) != pid:
            continue
        comm, _, _, sym, dso = m.groups()
        sym = sym.split("+")[0].strip()
        total += 1
        threads[re.sub(r"-\d+$", "", comm.strip())] += 1
        kinds[kind(sym, dso)] += 1
        syms[sym[:80]] += 1
    if not total:
        sys.exit(f"no samples for pid {pid}")
    for title, counter, n in (("threads", threads, 10), ("code", kinds, 12), ("symbols", syms, 15)):
        print(f"== {title} ({total} samples)")
        for k, v in counter.most_common(n):
            print(f"{100 * v / total:5.1f} %  {k}")


if __name__ == "__main__":
    main()
