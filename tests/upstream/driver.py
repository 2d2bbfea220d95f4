"""One rank of mpi4py's upstream test suite, with results written per test.

Run under a launcher: ``python driver.py --impl erdmampi --out DIR --testdir
TESTDIR [main.py options] test_module ...``.  With ``--impl erdmampi`` the
name ``mpi4py`` (and every ``mpi4py.X``) is an alias of ``erdmampi`` (and
``erdmampi.X``), so the suite runs unmodified.  Each rank appends one JSON
line per event to ``DIR/rank<R>.jsonl``: ``start`` before a test runs, then
its outcome, flushed at once so that a crash leaves the culprit named.
"""
import importlib
import importlib.abc
import importlib.util
import json
import os
import sys
import unittest


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serve ``mpi4py[.X]`` as the already importable ``erdmampi[.X]``."""

    def find_spec(self, name, path=None, target=None):
        if name != "mpi4py" and not name.startswith("mpi4py."):
            return None
        real = "erdmampi" + name[len("mpi4py"):]
        try:
            importlib.import_module(real)
        except ModuleNotFoundError as exc:
            if exc.name == real:
                return None
            raise
        return importlib.util.spec_from_loader(name, self, is_package=True)

    def create_module(self, spec):
        return sys.modules["erdmampi" + spec.name[len("mpi4py"):]]

    def exec_module(self, module):
        pass


def _rank():
    for key in ("ERDMA_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        if key in os.environ:
            return int(os.environ[key])
    return 0


class _Result(unittest.TextTestResult):
    log = None

    def _emit(self, test, outcome, detail=""):
        rec = {"test": test.id(), "outcome": outcome}
        if detail:
            rec["detail"] = detail[-2000:]
        self.log.write(json.dumps(rec) + "\n")
        self.log.flush()

    def startTest(self, test):
        self._emit(test, "start")
        self._failed = False
        super().startTest(test)

    def stopTest(self, test):
        super().stopTest(test)
        if not self._failed:
            self._emit(test, "pass")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._failed = True
        self._emit(test, "fail", self._exc_info_to_string(err, test))

    def addError(self, test, err):
        super().addError(test, err)
        self._failed = True
        tid = test.id() if hasattr(test, "id") else str(test)
        if isinstance(test, unittest.case._SubTest) or not hasattr(test, "_testMethodName"):
            self.log.write(json.dumps({"test": tid, "outcome": "error",
                                       "detail": self._exc_info_to_string(err, test)[-2000:]})
                           + "\n")
            self.log.flush()
            return
        self._emit(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._failed = True
        self._emit(test, "skip", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._failed = True
        self._emit(test, "xfail")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._failed = True
        self._emit(test, "fail", "unexpected success")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._failed = True
            self._emit(test, "fail", self._exc_info_to_string(err, subtest))


def main(argv):
    impl, out, testdir, rest = "erdmampi", ".", None, []
    it = iter(argv)
    for arg in it:
        if arg == "--impl":
            impl = next(it)
        elif arg == "--out":
            out = next(it)
        elif arg == "--testdir":
            testdir = next(it)
        else:
            rest.append(arg)
    if impl == "erdmampi":
        sys.meta_path.insert(0, _Alias())
        import erdmampi
        # ``mpi4py.rc`` is an object, not a module, in both packages
        sys.modules["mpi4py"] = erdmampi
        sys.modules["mpi4py.rc"] = erdmampi.rc
    sys.path.insert(0, testdir)
    sys.dont_write_bytecode = True
    os.makedirs(out, exist_ok=True)
    _Result.log = open(os.path.join(out, f"rank{_rank()}.jsonl"), "a")
    upstream = importlib.import_module("main")
    runner = unittest.TextTestRunner(resultclass=_Result, verbosity=0,
                                     stream=open(os.devnull, "w"))
    sys.argv = [os.path.join(testdir, "main.py")] + rest
    upstream.main(module=None, testRunner=runner)


if __name__ == "__main__":
    main(sys.argv[1:])
