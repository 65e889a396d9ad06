"""Ray for the jobs: join or start a cluster, and keep its console output to what a user needs.

What a plain local run printed before (non-TTY, Ray 2.60), and where it goes now:

- Ray Data's execution logs ("Starting execution of Dataset ...", "Execution plan ...", "... finished in
  N seconds", ~8 lines a wave) and its "Progress bars disabled" notice: console handler of the `ray.data`
  logger raised to WARNING; the file `<session>/logs/ray-data/ray-data.log` keeps everything.
- `ray.init`'s INFO lines ("Started a local Ray instance", "Generated new authentication token"):
  `logging_level=WARNING` for the `ray` logger (Ray's own log files are unchanged).
- "Warning: The Ray cluster currently does not have any available CPUs" (a snapshot when a dataset starts,
  while the previous stage's actors are being released): dropped from the console, kept in the file. (Its twin
  "Cluster resources are not enough to run any task from TaskPoolMapOperator[MapBatches(pair_cells)]" went with
  stage 2's dataset per wave: stage 2 is plain Ray tasks now.)
- Ray Data's issue detector ("Operator 'MapBatches(FactorActor)' uses 1.3GiB of memory per worker ... consider
  setting `memory=`", then "Found 1 issues"), 12 lines every 30 s of a run: dropped from the console, kept in the
  file.
- "Token authentication is enabled for this Ray cluster. Set RAY_AUTH_MODE=disabled to opt out": token
  authentication stays on (it keeps other users of the machine out of the local Ray and its dashboard);
  only this notice is dropped. Its opposite ("... is disabled ...") is kept: that one matters.
- "Actor with class name: 'MapWorker(...)' ... has constructor arguments in the object store and
  max_restarts > 0" (an ERROR line from Ray's C++ core worker, ray-project/ray#53727): not ours to fix.
  Ray Data 2.60 always hands its map transformer to pool actors as an ObjectRef (MapOperator.
  _map_transformer_ref) and the operator holds that ref for the pool's life, so the restart it warns
  about works (tests/test_job_faults.py kills actors and checks the resumed values). The command-line
  entry points drop exactly this line from the process's stderr (`filter_stderr`), nothing else.
- pyarrow's S3 client retrying a request itself ("arrow/filesystem/s3fs.cc:817: CompletedMultipartUpload got error
  embedded in a 200 OK response: SlowDown ..., retry = 1"): dropped the same way (the store's own retries say a
  failure for good in one line).
- a Ray worker's traceback, forwarded to the driver's console line by line ("(MapWorker(MapBatches(FactorActor))
  pid=N) Exception raised in creation task: ...", then ~30 lines of frames): one line there saying where it is kept
  (the worker's log file); the job's own last line says what failed (a factor actor that could not start and why).

Two traps of `ray job submit` against a head with token authentication (Ray's default for a head started where
`~/.ray/auth_token` exists, e.g. after any local `ray.init()`), each caught here with one line instead of a traceback:

- joining a head (`--ray-address`, `$RAY_ADDRESS`) from a process that sends no token, or the wrong one: Ray sends
  its token only with `RAY_AUTH_MODE=token` in the environment, and never on its own to an explicit address.
  `init_ray` raises `RayJoinError`, which says where the token lives (`auth_hint`);
- a job whose entrypoint `python` lacks the project's dependencies: `ray job submit` runs the `python` first on the
  PATH of the process that started the head (`.venv/bin/ray start --head` from a shell without the venv activated
  gives the system Python). `jobs/_python.py`, run by `jobs/__init__.py` before any heavy import, names the fix.

A local Ray whose raylet has not registered within Ray's fixed 30 s (a machine busy starting up; `ray.init` raises
"The current node timed out during startup") is shut down and started once more, with one line on stderr
(`once_more_if_slow`).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from xsbert_core.errors import XsbertError, terminate

# Lines of the process's stderr (fd 2, C++ included) that the command-line entry points drop.
DROPPED_STDERR = (
    re.compile(r"has constructor arguments in the object store and max_restarts > 0"),
    # Ray's GCS client, when a head refuses this process's token: init_ray says it in one line (RayJoinError).
    re.compile(r"gcs_client\.cc:\d+: Failed to get cluster ID from GCS server: Unauthenticated"),
    # pyarrow's S3 client retrying a request itself ("s3fs.cc:817: CompletedMultipartUpload got error embedded in a
    # 200 OK response: SlowDown (...), retry = 1"): the store retries its calls too, and says a failure for good in
    # one line (jobs/store/retry.py); a loaded store is not news on the console.
    re.compile(r"arrow/filesystem/s3fs\.cc:\d+: .*\bretry = \d+"),
)
# Log records dropped from the console (the log files keep them).
DROPPED_RECORDS = (
    re.compile(r"^Token authentication is enabled for this Ray cluster"),
    re.compile(r"^Progress bars disabled\."),
    # Ray Data checks free CPUs when a dataset starts; between the jobs' stages the last stage's actors may
    # still hold them for a moment (they are released: nothing waits on them). A real hang shows as no progress.
    re.compile(r"^Warning: The Ray cluster currently does not have any available CPUs"),
    # Ray Data's issue detector, every 30 s of a long run (12 lines each, 34 times in a 100k-pair run): the factor
    # actors' memory (the model and a batch's JVPs) is the job's by design; the log file keeps the warning.
    re.compile(r"^\s*Operator '[^']*' uses [\d.]+\s*\w+ of memory per worker"),
    re.compile(r"^Found \d+ issues?\. To disable issue detection"),
    # Ray Data's own account of a failed execution (a stack trace through its internals, and the actor's): the job
    # says what failed in its own one line (a factor actor that could not start and why, a batch that killed its
    # worker); the log file keeps them.
    re.compile(r"^Exception occurred in (?:Ray Data or Ray Core internal|user) code"),
    re.compile(r"^Full stack trace:"),
    re.compile(r"actors died during initialization \d+ consecutive time"),
    re.compile(r"^An exception was raised from a task of operator "),  # a batch that kept killing its worker
    # ... and its warning that a map stage asks for CPUs and GPUs both: the factor actors do, by design (stage1.py).
    re.compile(r"^Specifying both num_cpus and num_gpus for map tasks is experimental"),
)


# The start of a Ray worker's traceback forwarded to the driver (its lines prefixed "(<worker> pid=N[, ip=A]) ").
_WORKER_TRACEBACK = re.compile(r"^(\(.*?pid=\d+(?:, ip=[^)\s]+)?\)) (?:Exception raised in creation task|"
                               r"Traceback \(most recent call last\):)")  # fmt: skip
# A line of a traceback after its first (the worker's prefix taken off): its frames and their code (indented), a
# chained exception's header, the exception's own line.
_TRACEBACK_REST = re.compile(r"\s|\^|During handling of the above exception|The above exception was the direct cause|"
                             r"[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt)\b")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ConsoleLines:
    """fd 2's lines as the console shows them: those matching `patterns` left out, and a worker's forwarded traceback
    (the lines with its prefix from the first on) one line that says where the worker's log keeps it.

    Another process's line may come in the middle of a traceback (Ray forwards it in batches): the rest of it, the
    worker's next lines that read as a traceback's (indented, the exception's), are left out too."""

    def __init__(self, patterns=DROPPED_STDERR) -> None:
        self.patterns = patterns
        self.block: str | None = None  # the prefix of the traceback being left out
        self.cut: set[str] = set()  # the prefixes of tracebacks that another line came into

    def __call__(self, line: str) -> str | None:
        plain = _ANSI.sub("", line)
        if self.block is not None:
            if plain.startswith(self.block) or not plain.strip():  # Ray forwards it in batches, a blank line between
                return None
            self.cut.add(self.block)
            self.block = None
        if m := _WORKER_TRACEBACK.match(plain):
            self.block = m.group(1) + " "
            self.cut.discard(self.block)
            return (f"{m.group(1)} a traceback, left out here: the worker's log file keeps it (Ray's logs folder on "
                    "its node, /tmp/ray/session_latest/logs by default)")  # fmt: skip
        if prefix := next((p for p in self.cut if plain.startswith(p)), None):
            self.cut.discard(prefix)
            if _TRACEBACK_REST.match(plain[len(prefix) :]):  # the traceback goes on: left out, as its start
                self.block = prefix
                return None
        return None if any(p.search(plain) for p in self.patterns) else line


class _DropRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(p.search(message) for p in DROPPED_RECORDS)


class RayJoinError(XsbertError, ConnectionError):
    """The Ray cluster to join refused this process (token authentication), in one line that says what to do."""


# What Ray says when a head refuses a client for its token (gRPC status UNAUTHENTICATED; HTTP 401/403), Ray 2.52+.
_AUTH_REFUSED = re.compile(r"InvalidAuthToken|Unauthenticated: RPC error|Authentication token is missing or incorrect|"
                           r"Token authentication is enabled but no authentication token was found|"
                           r"Unauthorized: Missing authentication token|Forbidden: Invalid authentication token")


def spare_cpus(cpus: float) -> float:
    """The CPUs of a cluster that a long-lived actor pool (the job's factor actors, jobs.parse's parsers) leaves to
    the work beside it (the job's stage-2 tasks, Ray Data's other operators): one, or half of a smaller cluster."""
    return min(1.0, cpus / 2)


def token_source(environ=os.environ) -> str:
    """Where Ray reads this process's token: $RAY_AUTH_TOKEN, the file $RAY_AUTH_TOKEN_PATH, else ~/.ray/auth_token."""
    if environ.get("RAY_AUTH_TOKEN"):
        return "$RAY_AUTH_TOKEN"
    if environ.get("RAY_AUTH_TOKEN_PATH"):
        return environ["RAY_AUTH_TOKEN_PATH"]
    return os.path.join(os.path.expanduser("~"), ".ray", "auth_token")


def auth_hint(address: str | None, environ=os.environ) -> str:
    """One line for a join refused for its token: what this process sent, and where the token goes."""
    where = address or environ.get("RAY_ADDRESS") or "the local head"
    source = token_source(environ)
    mode = (environ.get("RAY_AUTH_MODE") or "").lower()
    if mode != "token":
        why = f"this process sent no token (RAY_AUTH_MODE is {mode or 'unset'}, not token)"
    elif source.startswith("$") or os.path.isfile(source):
        why = f"the token this process sent ({source}) is not the head's"
    else:
        why = f"this process has no token ({source} does not exist)"
    return (f"the Ray cluster at {where} uses token authentication and refused this process: {why}; run it with "
            f"RAY_AUTH_MODE=token and the head's token in {source} (`ray get-auth-token` on the head prints it; "
            "$RAY_AUTH_TOKEN_PATH names another file)")  # fmt: skip


def _refused_for_token(exc: BaseException, auth_error: type) -> bool:
    """Whether `exc` or what caused it is a refusal for the token (Ray 2.60 wraps the AuthenticationError of its GCS
    client in RuntimeError("Failed to connect to GCS ...") and that in ConnectionError)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, auth_error) or _AUTH_REFUSED.search(str(exc)):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


# Seconds a TCP connection to the head's GCS may take before the head counts as not answering (_probe_token).
HEAD_CONNECT_TIMEOUT_S = 10.0
DEFAULT_GCS_PORT = 6379  # a head's GCS port unless `ray start --head --port` says another (said for an address without one)


def _probe_head(target: str) -> None:
    """A RayJoinError of one line when nothing answers at the head's address `target` (host[:port]): its name does
    not resolve, the connection is refused, or none is made within HEAD_CONNECT_TIMEOUT_S. ray.init would retry
    such an address for minutes, repeating Ray's own warnings, and ignore SIGTERM meanwhile."""
    host, sep, port = target.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise RayJoinError(f"cannot join the Ray cluster at {target}: give the head's address as HOST:PORT, its GCS "
                           f"port ({DEFAULT_GCS_PORT} unless `ray start --head --port` said another)")  # fmt: skip
    host = host.strip("[]")
    why = None
    try:
        with socket.create_connection((host, int(port)), timeout=HEAD_CONNECT_TIMEOUT_S) as conn:
            if not _tls():
                why = _not_grpc(conn, f"{host}:{port}")
    except socket.gaierror as exc:
        why = f"the name {host!r} does not resolve ({exc.strerror})"
    except TimeoutError:
        why = f"no answer from {host}:{port} within {HEAD_CONNECT_TIMEOUT_S:g} s"
    except OSError as exc:
        why = f"nothing listens at {host}:{port} ({exc.strerror or type(exc).__name__})"
    if why is not None:
        raise RayJoinError(f"cannot join the Ray cluster at {target}: {why} (is its head up? `ray status` on the head "
                           "prints the address to join)")  # fmt: skip


# HTTP/2's client preface and an empty SETTINGS frame (RFC 9113 §3.4, §6.5): a gRPC server, as a head's GCS is,
# answers with a SETTINGS frame of its own (type 0x4, the fourth byte of its 9-byte header).
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])
GRPC_ANSWER_TIMEOUT_S = 5.0


def _tls() -> bool:
    """Whether this process talks TLS to the cluster (RAY_USE_TLS): then the GCS expects a TLS hello, not HTTP/2."""
    return os.environ.get("RAY_USE_TLS", "0").strip().lower() in ("1", "true", "yes")


def _not_grpc(conn: socket.socket, where: str) -> str | None:
    """Why what accepted the connection is no Ray GCS (None: it answers HTTP/2 as a gRPC server does). Something
    else listening there (a web server, Ray's dashboard or client port given for the GCS) left ray.init retrying for
    minutes, repeating its own warnings."""
    try:
        conn.settimeout(GRPC_ANSWER_TIMEOUT_S)
        conn.sendall(_H2_PREFACE)
        head = b""
        while len(head) < 9:
            chunk = conn.recv(9 - len(head))
            if not chunk:
                break
            head += chunk
    except TimeoutError:
        return (f"{where} accepts connections but does not answer as a Ray head's GCS (gRPC) within "
                f"{GRPC_ANSWER_TIMEOUT_S:g} s")  # fmt: skip
    except OSError as exc:
        return f"{where} accepts connections but closed this one ({exc.strerror or type(exc).__name__})"
    if len(head) == 9 and head[3] == 4:
        return None
    with contextlib.suppress(OSError):  # the rest of its first line, for the message
        conn.settimeout(1.0)
        head += conn.recv(200) if head and b"\n" not in head else b""
    line = head.split(b"\n")[0].decode("ascii", "replace").strip()
    said = repr(line[:60] + ("..." if len(line) > 60 else "")) if line else "nothing"
    return (f"{where} answers, but not as a Ray head's GCS (gRPC) does: it said {said}; the GCS port is "
            f"{DEFAULT_GCS_PORT} unless `ray start --head --port` said another (the dashboard's 8265 and the Ray "
            "client's 10001 are not it)")


def _probe_token(ray, address: str | None) -> None:
    """Before ray.init: a head that does not answer at all is one line at once (_probe_head); then one GCS request,
    since ray.init retries a refused token for about a minute before it fails: a refusal raises RayJoinError at once.
    Anything else (an address that is no GCS, Ray's private GcsClient changed) is left to ray.init to report."""
    target = address or os.environ.get("RAY_ADDRESS") or ""
    if "://" in target or target in ("", "auto", "local"):
        return  # ray:// clients and auto-detection: ray.init's own path
    _probe_head(target)
    try:
        from ray._raylet import GcsClient

        gcs = ray._private.services.canonicalize_bootstrap_address_or_die(target)
    except Exception:  # noqa: BLE001 - no GCS address: ray.init says what is wrong
        return
    for _ in range(3):  # a busy head may time out a request before it answers the token's refusal
        try:
            GcsClient(address=gcs)
            return
        except Exception as exc:  # noqa: BLE001 - only a refusal for the token is ours to report here
            if _refused_for_token(exc, ray.exceptions.AuthenticationError):
                raise RayJoinError(auth_hint(address)) from None


# What ray.init raises when the raylet it started has not registered within Ray's fixed 30 s (a machine busy starting)
RAY_SLOW_START = "timed out during startup"


def once_more_if_slow(init: Callable[[], Any], shutdown: Callable[[], Any]) -> None:
    """`init()` (a local Ray's start), and once more after `shutdown()` where it raised Ray's slow start
    (RAY_SLOW_START), saying so on stderr: a start that only took too long does not end the run; any other error, or
    a second slow start, is raised."""
    try:
        init()
    except Exception as exc:  # noqa: BLE001 - re-raised unless it is the slow start
        if RAY_SLOW_START not in str(exc):
            raise
        print(f"Ray did not start in time ({exc}); trying once more", file=sys.stderr, flush=True)
        shutdown()
        init()


@contextlib.contextmanager
def command_sigterm():
    """The command's own SIGTERM handler (xsbert_core.errors.terminate: the way out of Ctrl-C, one line) kept
    through the block: ray.init puts in one of its own, which exits at once with status 15 and nothing said."""
    import signal
    import threading

    before = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    finally:
        if before is terminate:
            signal.signal(signal.SIGTERM, before)


def init_ray(address: str | None = None):
    """Join a running cluster (`address`, $RAY_ADDRESS, or the one this process joined), else start a local one.

    Ray's INFO lines stay in its log folder; worker output still reaches the driver. A head that refuses this
    process for its token raises RayJoinError (one line: where the token lives)."""
    import ray

    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(_DropRecords())
    if not ray.is_initialized():
        if address or os.environ.get("RAY_ADDRESS"):
            _probe_token(ray, address)
            try:
                with command_sigterm():
                    ray.init(address=address, log_to_driver=True, logging_level=logging.WARNING)
            except Exception as exc:
                if _refused_for_token(exc, ray.exceptions.AuthenticationError):
                    raise RayJoinError(auth_hint(address)) from None
                if isinstance(exc, ConnectionError):  # Ray's own "Failed to connect to Ray cluster at ...": one line
                    where = address or os.environ.get("RAY_ADDRESS")
                    raise RayJoinError(f"cannot join the Ray cluster at {where}: {str(exc).splitlines()[0]} (is its "
                                       "head up? `ray status --address ...` on the head tells)") from None  # fmt: skip
                raise
        else:
            with command_sigterm():
                once_more_if_slow(lambda: ray.init(num_cpus=os.cpu_count() or 1, logging_level=logging.WARNING),
                                  ray.shutdown)  # fmt: skip
    return ray


def quiet_ray(ray, progress_bars: bool) -> None:
    """Ray Data's progress bars only where asked (a TTY and no -q); its execution logs only in its log file."""
    ray.data.DataContext.get_current().enable_progress_bars = progress_bars
    for handler in logging.getLogger("ray.data").handlers:
        if not isinstance(handler, logging.FileHandler) and "File" not in type(handler).__name__:
            handler.setLevel(logging.WARNING)
            if not any(isinstance(f, _DropRecords) for f in handler.filters):
                handler.addFilter(_DropRecords())


_filter_lock = threading.Lock()
_filter_installed = False


def filter_stderr(patterns=DROPPED_STDERR) -> None:
    """This process's fd 2 through ConsoleLines(patterns) (Ray's C++ logs write there directly).

    For the command-line entry points only: fd 2 becomes a pipe read by a thread that passes every other line
    through unchanged (its bytes); at exit the pipe is drained before the process ends."""
    global _filter_installed
    with _filter_lock:
        if _filter_installed:
            return
        _filter_installed = True
    sys.stderr.flush()
    original = os.dup(2)
    read_fd, write_fd = os.pipe()
    os.dup2(write_fd, 2)
    os.close(write_fd)

    shown = ConsoleLines(patterns)

    def pump() -> None:
        with os.fdopen(read_fd, "rb", buffering=0) as pipe:
            pending = b""
            while chunk := pipe.read(65536):
                pending += chunk
                *lines, pending = pending.split(b"\n")
                keep = []
                for ln in lines:
                    text = ln.decode("utf-8", "replace")
                    if (said := shown(text)) is not None:
                        keep.append(ln if said == text else said.encode())  # a line kept: its bytes as they came
                if keep:
                    os.write(original, b"".join(k + b"\n" for k in keep))
            if pending:
                os.write(original, pending)

    thread = threading.Thread(target=pump, name="xsbert-stderr-filter", daemon=True)
    thread.start()

    def restore() -> None:
        sys.stderr.flush()
        os.dup2(original, 2)  # closes the pipe's last write end: the pump reads EOF and drains
        thread.join(timeout=5)

    atexit.register(restore)
