"""Runs UCM's own V1 store e2e scripts against UCM-Go (tools/ucm-e2e/run.sh is the entry point).

From a UCM git mirror (a bare repo) it extracts, into a temporary work directory, UCM's Python
package (every .py file under ucm/) and the scripts of ucm/store/test/e2e/, applies subs.py's
table to each script (store -> ucmgo.UcmGoStore, cuda -> cpu, smaller counts), puts
shim/ucmlogger.py in place of UCM's compiled logger, and runs each script in a fresh directory
of its own with PYTHONPATH = shim (sitecustomize: children's exit codes count), the extracted
package and UCM-Go's Python package. Each script is its own process group, killed on timeout
and after it ends; the temporary directories are removed at exit (--keep leaves them).
"""

import argparse
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

import subs  # noqa: E402

E2E_DIR = "ucm/store/test/e2e"
LOGGER_STUB = "ucm/shared/infra/ucmlogger.py"  # where ucm/logger.py imports the compiled one from


def git(mirror, *args) -> bytes:
    return subprocess.run(["git", "--git-dir", str(mirror), *args], check=True, capture_output=True).stdout


def extract(mirror: Path, rev: str, dest: Path) -> str:
    """Extracts ucm/**.py at rev into dest; returns "<short hash> <subject>" of rev."""
    data = git(mirror, "archive", "--format=tar", rev, "ucm")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = []
        for m in tar.getmembers():
            if not (m.isfile() and m.name.endswith(".py")):
                continue
            p = Path(m.name)
            if p.is_absolute() or ".." in p.parts:
                raise SystemExit("ucm-e2e: unsafe path in the archive: %s" % m.name)
            members.append(m)
        tar.extractall(dest, members=members)
    if (dest / LOGGER_STUB).exists():
        raise SystemExit("ucm-e2e: %s exists in UCM's tree: the logger stub would shadow it" % LOGGER_STUB)
    if not (dest / "ucm/logger.py").read_text().count("from ucm.shared.infra import ucmlogger"):
        raise SystemExit("ucm-e2e: ucm/logger.py no longer imports ucm.shared.infra.ucmlogger: update LOGGER_STUB")
    shutil.copy(HERE / "shim" / "ucmlogger.py", dest / LOGGER_STUB)
    return git(mirror, "log", "-1", "--format=%h %s", rev).decode().strip()


class Runner:
    """Runs scripts in fresh directories, one process group each, and cleans up after them."""

    def __init__(self, base: Path, env: dict, timeout: float, keep: bool, verbose: bool, tail: int):
        self.base, self.env, self.timeout = base, env, timeout
        self.keep, self.verbose, self.tail = keep, verbose, tail
        self.proc = None
        self.dirs = []

    def kill_group(self):
        """SIGTERM, then SIGKILL, to the current script's process group, each with 5 s for
        the group to be gone; True when some process of the group was still there."""
        p, self.proc = self.proc, None
        if p is None:
            return False
        p.poll()
        left = False
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                break
            left = True
            if group_gone(p.pid, 5.0, p):
                break
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        return left

    def run(self, name: str, script: Path):
        """Runs script in a new directory; returns (passed, seconds, detail lines)."""
        rundir = Path(tempfile.mkdtemp(prefix="run-%s-" % name, dir=self.base))
        self.dirs.append(rundir)
        log = rundir / "output.log"
        env = dict(self.env, UCM_LOG_PATH=str(rundir / "log"))
        t0 = time.monotonic()
        timed_out = False
        left = False
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(script)], cwd=rundir, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE if self.verbose else out, stderr=subprocess.STDOUT,
                start_new_session=True)
            pump = None
            if self.verbose:
                pump = threading.Thread(target=copy_lines, args=(self.proc.stdout, out), daemon=True)
                pump.start()
            try:
                code = self.proc.wait(timeout=self.timeout)
                # multiprocessing's resource tracker leaves when its pipe closes: give whatever
                # of the group is left a moment to leave on its own
                group_gone(self.proc.pid, 3.0)
            except subprocess.TimeoutExpired:
                timed_out, code = True, None
            finally:
                # a timeout's whole group, or whatever a finished script left running
                left = self.kill_group() and not timed_out
            if pump:
                pump.join(timeout=5)
        secs = time.monotonic() - t0
        text = log.read_text(errors="replace").splitlines()
        passed = code == 0 and not timed_out
        if passed:
            detail = []
        elif timed_out:
            detail = ["timed out after %.0f s" % self.timeout] + text[-self.tail:]
        else:
            how = "killed by signal %d" % -code if code < 0 else "exit status %d" % code
            detail = [how] + relevant(text, self.tail)
        if left:
            detail.append("note: processes of the script were still running after it exited (killed)")
        if not self.keep:
            shutil.rmtree(rundir, ignore_errors=True)
        return passed, secs, detail

    def cleanup(self):
        self.kill_group()
        if not self.keep:
            for d in self.dirs:
                shutil.rmtree(d, ignore_errors=True)


def group_gone(pgid, seconds, leader=None):
    """Waits up to seconds for process group pgid to be empty; True when it is. leader, if
    given, is reaped meanwhile (a zombie leader keeps its group alive)."""
    deadline = time.monotonic() + seconds
    while True:
        if leader is not None:
            leader.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)


def copy_lines(src, out):
    """Copies src's lines to out and, indented, to stdout (--verbose)."""
    for line in src:
        out.write(line)
        out.flush()
        sys.stdout.write("    | " + line.decode(errors="replace"))
        sys.stdout.flush()


def relevant(lines, tail):
    """The lines worth reading of a failed run: from the first traceback (or child-failure
    line) on, at most tail of them, plus the last line (the exception) if cut."""
    start = next((i for i, s in enumerate(lines) if s.startswith("Traceback") or s.startswith("ucm-e2e:")
                  or s.startswith("Process ")), max(0, len(lines) - tail))
    out = lines[start:start + tail]
    if start + tail < len(lines):
        out += ["    ..."] + lines[-3:]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="run.sh", description=__doc__.splitlines()[0])
    ap.add_argument("mirror", nargs="?", help="UCM's git dir (a bare repo)")
    ap.add_argument("scripts", nargs="*", help="run only these scripts (default: all eleven)")
    ap.add_argument("--rev", default="HEAD", help="UCM revision to extract (default HEAD)")
    ap.add_argument("--timeout", type=float, default=240, help="seconds per script (default 240)")
    ap.add_argument("--base", default=os.environ.get("TMPDIR", "/tmp"),
                    help="where the work directory goes (O_DIRECT-capable; default $TMPDIR or /tmp)")
    ap.add_argument("--installed", action="store_true",
                    help="use the ucmgo installed for this python instead of connector/python and lib/libucmgo.so")
    ap.add_argument("--keep", action="store_true", help="keep the work and run directories")
    ap.add_argument("--show", action="store_true", help="print each script's diff after substitution and exit")
    ap.add_argument("-v", "--verbose", action="store_true", help="stream each script's output")
    ap.add_argument("--tail", type=int, default=25, help="lines of a failure's output to print (default 25)")
    ap.add_argument("--run-file", action="append", default=[], metavar="PATH",
                    help="run this script as is, besides or instead of UCM's (the runner's self-test)")
    a = ap.parse_args(argv)

    names = a.scripts or ([] if a.run_file else list(subs.SCRIPTS))
    unknown = [n for n in names if n not in subs.SCRIPTS]
    if unknown:
        ap.error("unknown script(s) %s; known: %s" % (", ".join(unknown), ", ".join(subs.SCRIPTS)))
    if names and not a.mirror:
        ap.error("MIRROR is required to run UCM's scripts")

    os.makedirs(a.base, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="ucm-e2e-", dir=a.base))
    runner = None

    def on_signal(sig, _frame):
        raise KeyboardInterrupt("signal %d" % sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    try:
        pkg, scripts = work / "pkg", work / "scripts"
        scripts.mkdir()
        jobs = []
        if names:
            pkg.mkdir()
            rev = extract(Path(a.mirror), a.rev, pkg)
            print("UCM %s (%s)" % (rev, a.mirror))
            for n in names:
                src = pkg / E2E_DIR / (n + ".py")
                if not src.is_file():
                    raise SystemExit("ucm-e2e: %s is not in UCM's %s" % (n, E2E_DIR))
                orig = src.read_text()
                text = subs.substitute(n, orig)
                dst = scripts / (n + ".py")
                dst.write_text(text)
                if a.show:
                    import difflib
                    sys.stdout.writelines(difflib.unified_diff(
                        orig.splitlines(True), text.splitlines(True), "ucm/" + n + ".py", n + ".py"))
                jobs.append((n, dst))
            if a.show:
                return 0
        for f in a.run_file:
            jobs.append((Path(f).stem, Path(f).resolve()))

        path = [str(HERE / "shim"), str(pkg)]
        env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
        if a.installed:
            where = "installed ucmgo"
        else:
            lib = Path(os.environ.get("UCMGO_LIB", REPO / "lib" / "libucmgo.so"))
            if names and not lib.is_file():
                raise SystemExit("ucm-e2e: %s is missing: run `make lib`" % lib)
            path.append(str(REPO / "connector" / "python"))
            env["UCMGO_LIB"] = str(lib)
            where = "connector/python, %s" % lib
        env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p])
        print("ucmgo: %s; python %s; work dir %s" % (where, sys.executable, work))

        runner = Runner(work, env, a.timeout, a.keep, a.verbose, a.tail)
        passed = 0
        for n, script in jobs:
            print("---- %s" % n, flush=True)
            ok, secs, detail = runner.run(n, script)
            passed += ok
            print("%s %s (%.1f s)" % ("PASS" if ok else "FAIL", n, secs))
            for line in detail:
                print("    " + line)
            sys.stdout.flush()
        print("%d of %d passed" % (passed, len(jobs)))
        return 0 if passed == len(jobs) else 1
    except subs.SubstitutionError as e:
        print("ucm-e2e: %s" % e, file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        print("ucm-e2e: interrupted (%s)" % (e or "SIGINT"), file=sys.stderr)
        return 130
    finally:
        if runner:
            runner.cleanup()
        if a.keep:
            print("kept %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
