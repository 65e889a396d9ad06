"""Store locations: the one parser of locations (`Location`, over the scheme table), redaction, and the filesystem of
a URI."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from xsbert_core.errors import XsbertError

# How long pyarrow's GCS client retries a failing request, in seconds (XSBERT_GCS_RETRY_S; pyarrow's own default is
# 15 minutes: an unreachable endpoint would hang the job that long before it says so).
GCS_RETRY_S = 30.0
# How many times the S3 client tries one request on a filesystem whose every call the caller retries: the read side
# (xsbert sql, serve, show, the report: jobs/sqlrun's reads). The job's writes keep the client's own retries of each
# multipart request under ours. pyarrow's default (3, with the AWS SDK's own backoff) under retry.retried's
# multiplied the tries and made each fault cost the SDK's sleeps besides ours: one layer of retries, ours, whose
# deadline is XSBERT_STORE_RETRY_S.
AWS_CLIENT_ATTEMPTS_UNDER_RETRIED = 1
# Object-store URI schemes -> their family (pyarrow's filesystem type); jobs/sqlrun reads runs under all of them.
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


def env_seconds(name: str, default: float, positive: bool = False) -> float:
    """Seconds from the environment variable `name` (XSBERT_STORE_RETRY_S, ...), else `default`; a StoreError of one
    line that names the variable when its value is not a number of seconds (>= 0; > 0 with `positive`). Read where
    the value is used, so that a bad one is said by the command that needs it, not as a traceback on import."""
    import math

    text = os.environ.get(name, "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0 or (positive and value == 0):
        raise StoreError(f"{name}={text!r}: not a number of seconds {'above' if positive else 'from'} 0")
    return value


_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


@dataclass(frozen=True)
class Location:
    """A store location, parsed once (`Location.parse`): a local folder, or a prefix on object storage. The store and
    the jobs below their entry points take this value; none of them looks at a location's text again.

        scheme   the object-store scheme ('s3', 's3a', 'gs', 'gcs'); None for a local folder
        path     where it is in its filesystem: 'bucket/prefix' (no trailing slash), or the local path as given
    """

    scheme: str | None
    path: str

    @classmethod
    def parse(cls, location: str | os.PathLike | Location, error: type[Exception] = StoreError) -> Location:
        """The one parser of store locations. `error` (StoreError; jobs.sqlrun's InputError) for any other
        `scheme://` (az://, http://, file://, ...: never taken for a local folder) and for a URI with credentials
        in it."""
        if isinstance(location, Location):
            return location
        text = os.fspath(location)
        m = _SCHEME_RE.match(text)
        if m is None:
            return cls(None, text)
        name = m.group(1).lower()
        if name not in REMOTE_SCHEMES:
            raise error(f"{text}: unsupported location (a local path, or "
                        f"{', '.join(s + '://' for s in REMOTE_SCHEMES)})")  # fmt: skip
        rest = text[m.end() :]
        if "@" in rest.split("/", 1)[0]:  # s3://KEY:SECRET@bucket/...
            raise error(f"{name}:// URI with credentials in it: not accepted (they would show in logs and reports); "
                        "put credentials and options in the environment, not in the URI (AWS_ACCESS_KEY_ID / "
                        "AWS_SECRET_ACCESS_KEY, a profile, a role; GOOGLE_APPLICATION_CREDENTIALS)")  # fmt: skip
        return cls(name, rest.rstrip("/"))

    @property
    def is_remote(self) -> bool:
        """On object storage (s3://, gs://), not a local folder."""
        return self.scheme is not None

    @property
    def family(self) -> str | None:
        """The object store's family ('s3', 'gcs': pyarrow's filesystem type), None for a local folder."""
        return REMOTE_SCHEMES[self.scheme] if self.scheme else None

    @property
    def uri(self) -> str:
        """s3://bucket/prefix, or the local path."""
        return f"{self.scheme}://{self.path}" if self.scheme else self.path

    def __str__(self) -> str:
        return self.uri

    @property
    def bucket(self) -> str:
        return self.path.split("/", 1)[0]

    @property
    def name(self) -> str:
        """The last component (a run's id)."""
        return self.path.rstrip("/").rsplit("/", 1)[-1] if self.scheme else Path(self.path).name

    @property
    def parent(self) -> Location:
        return Location(self.scheme, self.path.rsplit("/", 1)[0] if self.scheme else str(Path(self.path).parent))

    def join(self, *parts: str) -> Location:
        """`location/part/...`."""
        if self.scheme:
            return Location(self.scheme, "/".join([self.path, *parts]))
        return Location(None, str(Path(self.path).joinpath(*parts)))

    @property
    def local(self) -> Path:
        """A local folder's path (`~` expanded)."""
        if self.scheme:
            raise StoreError(f"{self.uri} is on object storage, not a local folder")
        return Path(self.path).expanduser()

    def resolved(self) -> str | Path:
        """As the jobs hold a location: an object-store URI (a str without a trailing slash), else an absolute
        Path."""
        return self.uri if self.scheme else self.local.resolve()

    def filesystem(self, settings: dict[str, str] | None = None):
        """(pyarrow FileSystem, path in it): S3 / GCS as `filesystem` makes them, a local folder's absolute path on
        the local filesystem."""
        if self.scheme:
            return filesystem(self.uri, settings)
        import pyarrow.fs as pafs

        return pafs.LocalFileSystem(), str(self.local.resolve())


def resolve(location: str | os.PathLike) -> str | Path:
    """A location as the jobs hold it: an object-store URI as a str without a trailing slash, else an absolute
    Path (`~` expanded)."""
    return Location.parse(location).resolved()


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
    if Location.parse(location).family == "gcs":
        return gcs_emulator() or "Google Cloud Storage"
    url = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    return re.sub(r"//[^/@]*@", "//", url) if url else "AWS S3"


def fs_settings(location: str | Location) -> dict[str, str]:
    """The non-secret connection settings of `location`'s store, from this process's environment: for S3 the endpoint
    (AWS_ENDPOINT_URL_S3 / AWS_ENDPOINT_URL) and region, for GCS the endpoint of STORAGE_EMULATOR_HOST. They
    travel to the workers that write parts, as a pyarrow filesystem pickled by Ray Data would carry them;
    credentials never do (workers use their own: the node's instance role or profile, a Kubernetes Secret or
    service account, the node's environment; never a job's runtime_env, which Ray shows with the job)."""
    from urllib.parse import urlsplit

    family = Location.parse(location).family
    out: dict[str, str] = {}
    if family == "gcs":
        emulator = gcs_emulator()
        if emulator:  # an emulator checks no credentials; Google's endpoint is pyarrow's default
            ep = urlsplit(emulator)
            out.update(endpoint_override=ep.netloc, scheme=ep.scheme or "http", anonymous="true")
        return out
    if family != "s3":
        return {}
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    if endpoint:
        ep = urlsplit(endpoint)
        out.update(endpoint_override=ep.netloc or ep.path, scheme=ep.scheme or "https")
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        out["region"] = region
    return out


def filesystem(location: str | Location, settings: dict[str, str] | None = None, caller_retries: bool = False):
    """(pyarrow FileSystem, path inside it) for an s3:// or gs:// location. S3 credentials, region and endpoint come
    the standard way: AWS_* variables (AWS_ENDPOINT_URL / AWS_ENDPOINT_URL_S3 for S3-compatible stores), the
    shared config files, instance roles; GCS credentials from Google's application default credentials
    (GOOGLE_APPLICATION_CREDENTIALS, the node's service account), STORAGE_EMULATOR_HOST for another endpoint;
    `settings` (fs_settings of the driver) overrides endpoint and region.

    caller_retries: every call made on the filesystem is retried by the caller (retry.retried), so the S3 client
    tries each request once (AWS_CLIENT_ATTEMPTS_UNDER_RETRIED) instead of adding its own backoff under ours."""
    from datetime import timedelta

    import pyarrow.fs as pafs

    loc = Location.parse(location)
    if "?" in loc.path:
        raise StoreError(f"{redact(loc.uri)}: put credentials and options in the environment (AWS_*, "
                         "GOOGLE_APPLICATION_CREDENTIALS), not in the URI")  # fmt: skip
    chosen = fs_settings(loc) if settings is None else dict(settings)
    if loc.family == "s3":
        if caller_retries:
            chosen["retry_strategy"] = pafs.AwsStandardS3RetryStrategy(max_attempts=AWS_CLIENT_ATTEMPTS_UNDER_RETRIED)
        return pafs.S3FileSystem(**chosen), loc.path
    if loc.family == "gcs":
        anonymous = chosen.pop("anonymous", "") == "true"
        retry = timedelta(seconds=env_seconds("XSBERT_GCS_RETRY_S", GCS_RETRY_S))
        return pafs.GcsFileSystem(anonymous=anonymous, retry_time_limit=retry, **chosen), loc.path
    raise StoreError(f"{loc.uri}: not on object storage (a local folder has no object-store filesystem)")
