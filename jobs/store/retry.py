"""Object-store calls retried on transient failures, and failures said in one line."""

from __future__ import annotations

import logging
import random
import re
import time

from .uri import Location, StoreError, env_seconds, redact

logger = logging.getLogger("jobs.store")

# How long one object-store call is retried when the store answers 5xx / 408 / 429 or the connection fails (a loaded
# store, a network blip), in seconds: backoff doubling from RETRY_FIRST_S up to RETRY_MAX_SLEEP_S, each sleep drawn
# uniformly below it (full jitter, so that many workers do not retry in step). `--store-retry-s` of jobs.attribute,
# XSBERT_STORE_RETRY_S for every job. After that the job stops in one line (exit 2); the same command resumes.
STORE_RETRY_S = 120.0
RETRY_FIRST_S = 0.2
RETRY_MAX_SLEEP_S = 10.0
# A call whose retries go past RETRY_NOTICE_S is said on the console (a warning of this logger), and again every
# NOTICE_EVERY_S while calls keep failing, once per process however many calls wait: a wrong endpoint or a dark
# store is not a silent wait of XSBERT_STORE_RETRY_S.
RETRY_NOTICE_S = 5.0
NOTICE_EVERY_S = 30.0
_noticed = [float("-inf")]  # when this process last said so (time.monotonic)


def store_retry_s() -> float:
    """The deadline of one store call's retries: XSBERT_STORE_RETRY_S, else STORE_RETRY_S."""
    return env_seconds("XSBERT_STORE_RETRY_S", STORE_RETRY_S)


# What a store's answer or a dropped connection looks like in the clients' errors: pyarrow's S3 filesystem ("AWS
# Error SLOW_DOWN during PutObject operation", "(HTTP status 503)", curl's codes), boto3 (status and code in
# ClientError.response, ConnectionClosedError / EndpointConnectionError), pyarrow's GCS filesystem and
# google-cloud-storage (status names, api_core exceptions with .code).
_AWS_CODES = {"SLOW_DOWN": 503, "SERVICE_UNAVAILABLE": 503, "INTERNAL_FAILURE": 500, "THROTTLING": 429,
              "ACCESS_DENIED": 403, "INVALID_ACCESS_KEY_ID": 403, "SIGNATURE_DOES_NOT_MATCH": 403,
              "NO_SUCH_BUCKET": 404, "REQUEST_TIMEOUT": 408}  # fmt: skip
_TRANSIENT_TEXT = ("network_connection", "curlcode", "connection reset", "connection was closed", "connection aborted",
                   "broken pipe", "timed out", "timeout", "could not connect", "couldn't connect", "connection refused",
                   "unavailable", "deadline_exceeded", "slowdown", "slow down", "internalerror", "internal error",
                   "try again", "temporarily")  # fmt: skip


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a failed store call, None when no response came (or none is named)."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    code = getattr(exc, "code", None)  # google.api_core exceptions
    if isinstance(code, int) and 100 <= code < 600:
        return code
    text = str(exc)
    m = re.search(r"HTTP status (\d{3})", text) or re.search(r"\bstatus(?: code)?[ :=]+(\d{3})\b", text, re.IGNORECASE)
    if m:
        return int(m.group(1))
    m = re.search(r"AWS Error ([A-Z_]+)", text)
    if m and m.group(1) in _AWS_CODES:
        return _AWS_CODES[m.group(1)]
    return None


def no_such_upload(exc: BaseException) -> bool:
    """The store knows no such multipart upload (404 NoSuchUpload): completed, aborted, or never begun."""
    low = str(exc).lower()
    return "nosuchupload" in low or "no_such_upload" in low


def transient(exc: BaseException) -> bool:
    """A failure worth retrying: 5xx, 408, 429, or no answer at all (reset, refused, timed out)."""
    if isinstance(exc, StoreError):
        return False
    low = str(exc).lower()
    if no_such_upload(exc):  # a multipart upload whose completion's answer was lost: the whole upload is tried again
        return True  # (same name, same bytes); an abort treats it as done instead (clients.abort_uploads)
    status = http_status(exc)
    if status is not None:
        return status >= 500 or status in (408, 429)
    name = type(exc).__name__
    if name in ("ConnectionClosedError", "EndpointConnectionError", "ReadTimeoutError", "ConnectTimeoutError",
                "ConnectionError", "ProtocolError", "ConnectionResetError", "TimeoutError"):  # fmt: skip
        return True
    return any(k in low for k in _TRANSIENT_TEXT)


class GaveUp(Exception):
    """A store call failed for good: `error` after `tries` tries in `waited` seconds."""

    def __init__(self, error: BaseException, tries: int, waited: float) -> None:
        super().__init__(str(error))
        self.error, self.tries, self.waited = error, tries, waited


def retried(fn, deadline_s: float):
    """fn(), tried again on transient failures (backoff with full jitter, the last pause cut to end at the deadline)
    for up to `deadline_s` seconds; GaveUp with the last error when a failure is not transient or the deadline has
    passed. A call failing past RETRY_NOTICE_S is said once on the console (_notice)."""
    start = time.monotonic()
    tries = 0
    while True:
        tries += 1
        try:
            return fn()
        except StoreError:
            raise
        except Exception as exc:
            waited = time.monotonic() - start
            if not transient(exc) or waited >= deadline_s:
                raise GaveUp(exc, tries, waited) from exc
            backoff = min(RETRY_MAX_SLEEP_S, RETRY_FIRST_S * 2 ** (tries - 1))
            pause = min(deadline_s - waited, random.uniform(0, backoff))
            logger.info("store call failed (%s), try %d again in %.2f s", " ".join(str(exc).split())[:200], tries + 1,
                        pause)  # fmt: skip
            if waited + pause >= RETRY_NOTICE_S:
                _notice(exc, tries, waited, deadline_s)
            time.sleep(pause)


def _notice(exc: BaseException, tries: int, waited: float, deadline_s: float) -> None:
    """The console's warning that store calls keep failing: at most once per NOTICE_EVERY_S in a process."""
    now = time.monotonic()
    if now - _noticed[0] >= NOTICE_EVERY_S:
        _noticed[0] = now
        logger.warning("a store call keeps failing (%s; %d tr%s in %.0f s); trying again for up to %.0f s in all "
                       "(--store-retry-s / XSBERT_STORE_RETRY_S)", describe_failure(exc), tries,
                       "y" if tries == 1 else "ies", waited, deadline_s)  # fmt: skip


def describe_failure(exc: BaseException) -> str:
    """What came back: `HTTP 503 (SlowDown)`, `no response (connection reset)`, ..."""
    status = http_status(exc)
    text = " ".join(str(exc).split())
    code = None
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
    if code is None:
        m = re.search(r"AWS Error ([A-Z_]+)", text)
        code = m.group(1) if m and m.group(1) != "UNKNOWN" else None
    if status is not None:
        return f"HTTP {status}" + (f" ({code})" if code else "")
    low = text.lower()
    if "refused" in low or "couldn't connect" in low or "could not connect" in low or "curlcode: 7," in low:
        return "no response (connection refused)"
    if "reset" in low or "closed" in low or "curlcode: 56" in low or "curlcode: 52" in low:
        return "no response (connection reset)"
    if "timed out" in low or "timeout" in low:
        return "no response (timed out)"
    return type(exc).__name__


def store_failure(root: str, exc: BaseException, doing: str, key: str | None = None,
                  gave_up: GaveUp | None = None) -> StoreError:
    """One line for a failed store call: what was being done, on which object, what came back (the HTTP status, or
    that no response came), after how many tries; the credentials hint only for 401/403."""
    text = " ".join(str(exc).split())
    low = text.lower()
    status = http_status(exc)
    gcs = Location.parse(root).family == "gcs"
    got = describe_failure(exc)
    if "nosuchbucket" in low or "bucket does not exist" in low or "the specified bucket does not exist" in low or gcs and ("404" in low or "notfound" in low) and "bucket" in low:
        why = "the bucket does not exist"
    elif status in (401, 403) or (gcs and ("default credentials" in low or "defaultcredentialserror" in low
                                           or "unauthenticated" in low or "permission_denied" in low)):  # fmt: skip
        where = ("GOOGLE_APPLICATION_CREDENTIALS, `gcloud auth application-default login`" if gcs
                 else "AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY, AWS_PROFILE")  # fmt: skip
        why = (f"access denied ({got}): check the credentials ({where}; on a cluster the node's role / instance "
               "profile or service account, or a Kubernetes Secret)")  # fmt: skip
    elif status is None and transient(exc) and ("refused" in got or "resolve" in low or "connect" in low):
        why = ("cannot reach the storage endpoint "
               + ("(STORAGE_EMULATOR_HOST / network)" if gcs else "(AWS_ENDPOINT_URL / network)") + f": {got}")  # fmt: skip
    elif transient(exc):
        why = f"the store did not answer ({got})"
    else:
        why = f"{got}: {text[:300]}" if got != type(exc).__name__ else text[:300]
    where = f" {key}" if key else ""
    tries = ""
    if gave_up is not None and transient(exc):
        n = gave_up.tries
        tries = (f", given up after {n} tr{'y' if n == 1 else 'ies'} in {gave_up.waited:.0f} s "
                 "(--store-retry-s / XSBERT_STORE_RETRY_S)")  # fmt: skip
    return StoreError(f"{redact(str(root))}: {doing}{where}: {why}{tries}")
