"""The runner's own tests: a script whose multiprocessing children fail is reported FAIL
(raise, non-zero exit, kill; fork and spawn; a grandchild), a clean one PASS, a timeout kills
the script's whole process group, and a substitution that does not match is an error.
No UCM mirror or libucmgo.so needed: `/usr/bin/python3 -m pytest tools/ucm-e2e`."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import subs  # noqa: E402


def script(tmp_path, name, body):
    p = tmp_path / (name + ".py")
    p.write_text(textwrap.dedent(body))
    return p


def run(tmp_path, *files, timeout=60, env=None):
    """Runs files through the runner; returns (exit status, output)."""
    args = [sys.executable, str(HERE / "ucm_e2e.py"), "--base", str(tmp_path), "--timeout", str(timeout)]
    for f in files:
        args += ["--run-file", str(f)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=120, env=dict(os.environ, **(env or {})))
    return r.returncode, r.stdout + r.stderr


CHILD = """
import multiprocessing, os, signal, sys

def child(how):
    if how == "raise":
        raise RuntimeError("the child fails")
    if how == "exit3":
        sys.exit(3)
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "nested":
        p = multiprocessing.Process(target=child, args=("raise",))
        p.start()
        p.join()

if __name__ == "__main__":
    multiprocessing.set_start_method("%s", force=True)
    ps = [multiprocessing.Process(target=child, args=(h,)) for h in ("ok", "%s")]
    for p in ps:
        p.start()
    for p in ps:
        p.join()
    print("parent done")
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
@pytest.mark.parametrize("how", ["raise", "exit3", "kill", "nested"])
def test_failed_child_fails_the_script(tmp_path, method, how):
    f = script(tmp_path, "child_" + how, CHILD % (method, how))
    # Without the runner the script exits 0: the check is what catches it.
    plain = subprocess.run([sys.executable, str(f)], capture_output=True, text=True, cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    code, out = run(tmp_path, f)
    assert code == 1, out
    assert "FAIL child_%s" % how in out, out
    assert "ucm-e2e: child process failed" in out, out
    assert "0 of 1 passed" in out, out


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_clean_children_pass(tmp_path, method):
    f = script(tmp_path, "child_ok", CHILD % (method, "ok"))
    code, out = run(tmp_path, f)
    assert code == 0, out
    assert "PASS child_ok" in out and "1 of 1 passed" in out, out


def test_failing_parent_and_summary(tmp_path):
    ok = script(tmp_path, "fine", "print('fine')\n")
    bad = script(tmp_path, "bad", "assert False, 'the assertion'\n")
    code, out = run(tmp_path, ok, bad)
    assert code == 1, out
    assert "PASS fine" in out and "FAIL bad" in out and "1 of 2 passed" in out, out
    assert "AssertionError: the assertion" in out, out


def test_timeout_kills_the_process_group(tmp_path):
    pidfile = tmp_path / "pids"
    f = script(tmp_path, "hangs", """
        import multiprocessing, os, time

        def child():
            time.sleep(600)

        if __name__ == "__main__":
            p = multiprocessing.Process(target=child)
            p.start()
            with open(os.environ["PIDFILE"], "w") as out:
                out.write("%d %d" % (os.getpid(), p.pid))
            time.sleep(600)
        """)
    code, out = run(tmp_path, f, timeout=3, env={"PIDFILE": str(pidfile)})
    assert code == 1, out
    assert "FAIL hangs" in out and "timed out after 3 s" in out, out
    pids = [int(x) for x in pidfile.read_text().split()]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("ucm-e2e-")], "work dir left behind"


def test_runs_in_a_fresh_directory(tmp_path):
    # Each script starts in its own empty directory (UCM's scripts write ./build/data).
    f = script(tmp_path, "cwd", """
        import os
        assert os.listdir(".") == ["output.log"], os.listdir(".")
        os.makedirs("build/data")
        """)
    code, out = run(tmp_path, f, f)
    assert code == 0 and "2 of 2 passed" in out, out


def test_substitution_must_match():
    text = 'x = "cuda:0"\ncount = 8\n'
    table = [(subs.DEVICE, '"cuda:0"', '"cpu"', 1), (subs.SIZE, "count = 8", "count = 2", 1)]
    assert subs.substitute("t", text, table) == 'x = "cpu"\ncount = 2\n'
    with pytest.raises(subs.SubstitutionError, match="expects 'count = 9' 1 time"):
        subs.substitute("t", text, table[:1] + [(subs.SIZE, "count = 9", "count = 2", 1)])
    with pytest.raises(subs.SubstitutionError, match="found 2"):
        subs.substitute("t", text + text, table)
    with pytest.raises(subs.SubstitutionError, match="'cuda' is left at line 4"):
        subs.substitute("t", text + "y = 1\nz = 'cuda:1'\n", table)


def test_every_script_has_a_store_row():
    assert len(subs.SCRIPTS) == 11
    for name, rows in subs.SCRIPTS.items():
        assert any(r[0] == subs.STORE for r in rows), name
        for kind, old, new, count in rows:
            assert kind in (subs.STORE, subs.DEVICE, subs.SIZE) and old and count >= 1, (name, old)
