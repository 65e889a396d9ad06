"""Store locations: the one parser of URIs (the scheme table), redaction, and the filesystem of a URI."""

from __future__ import annotations

import os
import re
from pathlib import Path

from xsbert_core.errors import XsbertError

# How long pyarrow's GCS client retries a failing request, in seconds (XSBERT_GCS_RETRY_S; pyarrow's own default is
# 15 minutes: an unreachable endpoint would hang the job that long before it says so).
GCS_RETRY_S = 30.0
# Object-store URI schemes -> their family (pyarrow's filesystem type); jobs/sqlrun.py reads runs under all of them.
REMOTE_SCHEMES: dict[str, str] = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs"}
# Where each family's credentials come from (for a message).
CREDENTIALS: dict[str, str] = {
    "s3": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN), AWS_PROFILE or the instance role",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS or the instance's service account",
}
# Where a run can be written: both families have the conditional create the writer lock needs (S3 through boto3,
# GCS through google-cloud-storage; pyarrow exposes neither).
WRITABLE_FAMILIES = ("s3", "gcs")


class StoreError(XsbertError, RuntimeError):
    """The store cannot be reached or written (endpoint, bucket, credentials, a lock held by another writer)."""

    __module__ = "jobs.store"  # its public name, as a remote traceback shows it (jobs.attribute reads that text)


_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def uri_scheme(location: str | os.PathLike, error: type[Exception] = StoreError) -> str | None:
    """The object-store scheme of `location` ('s3', 's3a', 'gs', 'gcs'), None for a local path; `error` for any
    other `scheme://` (az://, http://, file://, ...): never taken for a local folder. The one parser of store
    locations (jobs/sqlrun.py raises its InputError through it)."""
    m = _SCHEME_RE.match(str(location))
    if m is None:
        return None
    name = m.group(1).lower()
    if name not in REMOTE_SCHEMES:
        raise error(f"{location}: unsupported location (a local path, or {', '.join(s + '://' for s in REMOTE_SCHEMES)})")
    return name


def is_remote(root: str | os.PathLike) -> bool:
    """`root` is an object-storage URI (s3://, gs://), not a local path; StoreError for a scheme without a backend."""
    return uri_scheme(root) is not None


def resolve(location: str | os.PathLike) -> str | Path:
    """A location as the jobs hold it: an object-store URI as a str without a trailing slash, else an absolute
    Path (`~` expanded)."""
    return str(location).rstrip("/") if is_remote(location) else Path(location).expanduser().resolve()


def redact(uri: str) -> str:
    """The URI without user info or query (never write credentials into a manifest or a log)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(uri)
    host = parts.hostname or ""
    return urlunsplit((parts.scheme, host + (f":{parts.port}" if parts.port else ""), parts.path, "", ""))


def gcs_emulator() -> str | None:
    """STORAGE_EMULATOR_HOST (google-cloud-storage's variable for a GCS endpoint other than Google's), or None."""
    host = os.environ.get("STORAGE_EMULATOR_HOST", "").strip()
    if not host:
        return None
    return host if "://" in host else f"http://{host}"


def endpoint_name(location: str | os.PathLike) -> str:
    """The endpoint that `location`'s store is reached at, for a message: the environment's (AWS_ENDPOINT_URL_S3 /
    AWS_ENDPOINT_URL without any user:password@, STORAGE_EMULATOR_HOST), else the service's name."""
    family = REMOTE_SCHEMES.get(uri_scheme(location) or "", "")
    if family == "gcs":
        return gcs_emulator() or "Google Cloud Storage"
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return re.sub(r"//[^/@]*@", "//", url) if url else "AWS S3"


def fs_settings(uri: str) -> dict[str, str]:
    """The non-secret connection settings of `uri`'s store, from this process's environment: for S3 the endpoint
    (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL) and region, for GCS the endpoint of STORAGE_EMULATOR_HOST. They
    travel to the workers that write parts, as a pyarrow filesystem pickled by Ray Data would carry them;
    credentials never do (workers use their own: the node's instance role or profile, a Kubernetes Secret or
    service account, the node's environment; never a job's runtime_env, which Ray shows with the job)."""
    from urllib.parse import urlsplit

    scheme = urlsplit(uri).scheme.lower()
    out: dict[str, str] = {}
    if scheme in ("gs", "gcs"):
        emulator = gcs_emulator()
        if emulator:  # an emulator checks no credentials; Google's endpoint is pyarrow's default
            ep = urlsplit(emulator)
            out.update(endpoint_override=ep.netloc, scheme=ep.scheme or "http", anonymous="true")
        return out
    if scheme not in ("s3", "s3a"):
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        ep = urlsplit(endpoint)
        out.update(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        out["region"] = region
    return out


def filesystem(uri: str, settings: dict[str, str] | None = None):
    """(pyarrow FileSystem, path inside it) for an s3:// or gs:// URI. S3 credentials, region and endpoint come
    the standard way: AWS_* variables (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 for S3-compatible stores), the
    shared config files, instance roles; GCS credentials from Google's application default credentials
    (GOOGLE_APPLICATION_CREDENTIALS, the node's service account), STORAGE_EMULATOR_HOST for another endpoint;
    `settings` (fs_settings of the driver) overrides endpoint and region."""
    from datetime import timedelta
    from urllib.parse import urlsplit

    import pyarrow.fs as pafs

    parts = urlsplit(uri)
    if parts.query or parts.username or parts.password:
        raise StoreError(f"{redact(uri)}: put credentials and options in the environment (AWS_*, "
                         "GOOGLE_APPLICATION_CREDENTIALS), not in the URI")  # fmt: skip
    scheme = parts.scheme.lower()
    path = (parts.netloc + parts.path).rstrip("/")
    chosen = fs_settings(uri) if settings is None else dict(settings)
    if scheme in ("s3", "s3a"):
        return pafs.S3FileSystem(**chosen), path
    if scheme in ("gs", "gcs"):
        anonymous = chosen.pop("anonymous", "") == "true"
        return pafs.GcsFileSystem(anonymous=anonymous, retry_time_limit=timedelta(seconds=float(os.environ.get("XSBERT_GCS_RETRY_S", GCS_RETRY_S))),
                                  **chosen), path  # fmt: skip
    raise StoreError(f"{redact(uri)}: unsupported scheme {scheme!r} (use a local path, s3:// or gs://)")
