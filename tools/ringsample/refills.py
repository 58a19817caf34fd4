#!/usr/bin/python3
"""refills.py OUT...: summarises ringsample files of a dump (tools/ringsample/ringsample.c).

The dump is the span in which the process's first ring holds SQEs. Within it: the share of
samples with the device below 8 requests in flight, the share with >= 16 completions posted and
not reaped; the bursts (the device's in-flight count falling from >= 48 to <= 8 between two
samples: the queue completing at once) and, after each, the refill (until it holds 48 again):
fast (< 3 ms) or slow, and whether a slow one saw a thread blocked in the kernel or >= 16
completions unreaped for 2 ms or more, with the process's CPU and run-queue time over the slow ones;
and, when the samples have them (debugfs mounted), the share with the device's hardware queue
stopped and the mean writes on the device then."""
import sys


def longest(rows, cond):
    """The longest stretch of consecutive rows meeting cond, in microseconds."""
    best, start = 0, None
    for r in rows:
        if cond(r):
            start = r[0] if start is None else start
            best = max(best, r[0] - start)
        else:
            start = None
    return best


def summarise(path):
    rows = []
    with open(path) as f:
        for line in f:
            p = line.split()
            if len(p) < 13:
                continue
            # hw_stopped is column 13 in files that have it (older ones list D threads there).
            hw = int(p[13]) if len(p) > 14 and p[13].lstrip("-").isdigit() else -1
            rows.append((int(p[0]), int(p[2]), int(p[3]), int(p[4]), int(p[6]), int(p[7]), int(p[8]), hw))
    span = [r[0] for r in rows if r[2] > 0]
    if not span:
        return "%s: no ring activity" % path
    a, b = span[0], span[-1]
    d = [r for r in rows if a <= r[0] <= b]
    low = sum(1 for r in d if r[1] < 8)
    unreaped = sum(1 for r in d if r[3] >= 16)
    bursts, fast, slow, slow_ms, with_blocked, with_unreaped, cpu, runq = 0, 0, 0, 0.0, 0, 0, 0, 0
    i = 1
    while i < len(d):
        if d[i - 1][1] >= 48 and d[i][1] <= 8:
            bursts += 1
            j = i
            while j < len(d) and d[j][1] < 48:
                j += 1
            if j == len(d):
                break
            ms = (d[j][0] - d[i][0]) / 1000
            if ms < 3:
                fast += 1
            else:
                slow += 1
                slow_ms += ms
                with_blocked += any(r[4] > 0 for r in d[i:j + 1])
                with_unreaped += longest(d[i:j + 1], lambda r: r[3] >= 16) >= 2000
                cpu += d[j][5] - d[i][5]
                runq += d[j][6] - d[i][6]
            i = j
        i += 1
    stopped = [r for r in d if r[7] == 1]
    hw = ""
    if all(r[7] >= 0 for r in d):
        hw = "; hardware queue stopped %.1f %% (%.1f writes on the device then)" % (
            100 * len(stopped) / len(d), sum(r[1] for r in stopped) / max(len(stopped), 1))
    return ("%s: dump %.0f ms; device < 8 in flight %.1f %%, >= 16 unreaped %.1f %%; %d bursts (every %.1f ms); "
            "refills %d fast, %d slow (%.0f ms: %d with a blocked thread, %d with >= 16 unreaped for 2 ms or more; process CPU %.0f ms, "
            "run-queue wait %.0f ms)%s") % (path, (b - a) / 1000, 100 * low / len(d), 100 * unreaped / len(d), bursts,
                                          (b - a) / 1000 / max(bursts, 1), fast, slow, slow_ms, with_blocked,
                                          with_unreaped, cpu / 1000, runq / 1000, hw)


if __name__ == "__main__":
    for p in sys.argv[1:]:
        print(summarise(p))
