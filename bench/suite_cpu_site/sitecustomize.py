"""bench/suite_cpu.py's sampler, on PYTHONPATH for the processes of one `make test` run (and for nothing else): with
XSBERT_SUITE_CPU set to a folder, every Python process writes, once a second, what it is (argv, its ancestors, the
test that started it) and its CPU seconds so far to <folder>/procs/<pid>.json. A process that ends keeps its last
line, so a process shorter than a second counts ~0. Ray's daemons written in C++ (raylet, GCS) are not Python and
are not seen here; pytest's own count of its reaped children has them (bench/suite_cpu.py)."""

import os

if os.environ.get("XSBERT_SUITE_CPU"):
    import json
    import sys
    import threading
    import time

    def _ancestors(pid: int, n: int = 5) -> list[int]:
        out = []
        for _ in range(n):
            try:
                with open(f"/proc/{pid}/stat") as fh:
                    stat = fh.read()
                pid = int(stat[stat.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                break
            out.append(pid)
            if pid <= 1:
                break
        return out

    def _sample(folder: str) -> None:
        pid = os.getpid()
        record = {"pid": pid, "t0": time.time(), "argv": sys.argv[:6], "ancestors": _ancestors(pid),
                  "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
                  "worker": os.environ.get("PYTEST_XDIST_WORKER", "")}  # fmt: skip
        path = os.path.join(folder, "procs", f"{pid}.json")
        while True:
            times = os.times()
            record.update(cpu=times.user + times.system, t1=time.time(),
                          sentence_transformers="sentence_transformers" in sys.modules,
                          torch="torch" in sys.modules)  # fmt: skip
            try:
                with open(path, "w") as fh:
                    json.dump(record, fh)
            except OSError:
                pass
            time.sleep(1.0)

    os.makedirs(os.path.join(os.environ["XSBERT_SUITE_CPU"], "procs"), exist_ok=True)
    threading.Thread(target=_sample, args=(os.environ["XSBERT_SUITE_CPU"],), daemon=True).start()
