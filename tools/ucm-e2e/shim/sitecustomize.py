"""Loaded by every Python process the e2e runner starts (PYTHONPATH): a script whose
multiprocessing children failed must not exit 0.

Every multiprocessing.Process started in this process is remembered. When the process ends
(atexit in the main process; at the end of Process._bootstrap in a multiprocessing child,
which leaves through os._exit without atexit), each child is joined and any child that exited
non-zero or was killed by a signal makes this process exit with status 1 (if it was going to
exit 0), after a line on stderr naming the child. Daemon children still running at exit are
left to multiprocessing (it terminates them); pool workers are skipped (pools terminate them).

The system's own sitecustomize (Debian's), shadowed by this file, is run first.
"""

import atexit
import importlib.util
import os
import sys


def _chain():
    here = os.path.dirname(os.path.abspath(__file__))
    for d in sys.path:
        if not d or os.path.abspath(d) == here:
            continue
        path = os.path.join(d, "sitecustomize.py")
        if os.path.isfile(path):
            spec = importlib.util.spec_from_file_location("_system_sitecustomize", path)
            try:
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except Exception:  # noqa: BLE001 - as site.py does for a failing sitecustomize
                pass
            return


_chain()

import multiprocessing.process as _mpp  # noqa: E402

_started = []  # (pid of the starter, process)
_orig_start = _mpp.BaseProcess.start
_orig_bootstrap = _mpp.BaseProcess._bootstrap


def _start(self):
    _orig_start(self)
    if "PoolWorker" not in (self.name or ""):
        _started.append((os.getpid(), self))


def _failed_children():
    """Joins this process's children (each once); returns a description of each that failed."""
    failed = []
    me = os.getpid()
    mine = [p for pid, p in _started if pid == me]  # not those inherited through fork
    _started[:] = [(pid, p) for pid, p in _started if pid != me]
    for p in mine:
        try:
            if p.daemon and p.is_alive():
                continue
            p.join()
            code = p.exitcode
        except Exception as e:  # noqa: BLE001 - report, do not mask the run
            failed.append("%s: cannot be joined: %r" % (p.name, e))
            continue
        if code is None or code != 0:
            how = "killed by signal %d" % -code if code is not None and code < 0 else "exit code %s" % code
            failed.append("%s (pid %s): %s" % (p.name, p.pid, how))
    return failed


def _report(failed):
    for f in failed:
        sys.stderr.write("ucm-e2e: child process failed: %s\n" % f)


def _bootstrap(self, *args, **kwargs):
    code = _orig_bootstrap(self, *args, **kwargs)
    failed = _failed_children()
    if failed:
        _report(failed)
        if code == 0:
            code = 1
    return code


def _at_exit():
    failed = _failed_children()
    if failed:
        _report(failed)
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(1)


_mpp.BaseProcess.start = _start
_mpp.BaseProcess._bootstrap = _bootstrap
atexit.register(_at_exit)
