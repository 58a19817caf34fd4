"""bench.py, the ABI's cost measurement, runs end to end on tiny shapes: its four drivers (Go
without the C ABI, C and Python through libucmgo.so, ucm-lab bench) each dump, reload and, for the C
and Python drivers, compare every loaded byte; a failed call or a differing byte fails it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


@pytest.mark.skipif(not (REPO / "bin" / "ucm-lab").exists(), reason="make build first (make test-python does)")
def test_bench_runs_every_driver(tmp_path):
    out = subprocess.run(
        [sys.executable, str(HERE.parent / "bench.py"), "--dir", str(tmp_path), "--workload", "seq,layerwise",
         "--block-size", "256KiB", "--shards", "4", "--total", "4MiB", "--batch", "2", "--concurrency", "2",
         "--rounds", "1", "--json"],
        check=True, capture_output=True, text=True, env=dict(os.environ), timeout=600).stdout
    rows = json.loads(out)
    assert [r["workload"] for r in rows] == ["seq", "layerwise"]
    for r in rows:
        for who in ("go", "c", "python", "tool"):
            assert r[who + "_dump_mbps"] > 0 and r[who + "_load_mbps"] > 0, (who, r)
        for who in ("go", "c", "python"):
            assert r[who + "_load_cpu_us"] > 0 and r[who + "_load_submit_us"] > 0, (who, r)
