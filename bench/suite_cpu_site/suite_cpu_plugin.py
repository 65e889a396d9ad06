"""bench/suite_cpu.py's pytest plugin: each test's start and end, and the CPU seconds of its test process and of the
children it reaped meanwhile, one JSON line per test in <XSBERT_SUITE_CPU>/tests-<worker>.jsonl."""

import json
import os
import resource
import time

_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "main")
_started: dict[str, tuple[float, float, float]] = {}


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


def pytest_runtest_setup(item) -> None:
    _started[item.nodeid] = (time.time(), *_cpu())


def pytest_runtest_logfinish(nodeid, location) -> None:
    if nodeid not in _started:
        return  # the controller of a run with test processes, which runs no test: its workers write the lines
    t0, own0, kids0 = _started.pop(nodeid)
    own1, kids1 = _cpu()
    line = {"worker": _WORKER, "pid": os.getpid(), "test": nodeid, "t0": t0, "t1": time.time(),
            "own": own1 - own0, "children": kids1 - kids0}  # fmt: skip
    with open(os.path.join(os.environ["XSBERT_SUITE_CPU"], f"tests-{_WORKER}.jsonl"), "a") as fh:
        fh.write(json.dumps(line) + "\n")
