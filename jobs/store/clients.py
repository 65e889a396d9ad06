"""The storages' own clients where pyarrow has no call for it (S3 multipart uploads)."""

from __future__ import annotations

import logging
from typing import Any

from .retry import GaveUp, no_such_upload, retried
from .uri import Location, fs_settings

logger = logging.getLogger("jobs.store")


def s3_client(settings: dict[str, str] | None = None):
    """A boto3 S3 client from a fresh session: credentials as the environment says now (boto3's default session
    would keep the first ones it resolved for the life of the process); `settings` (fs_settings) override the
    endpoint and region. Short timeouts and few retries of its own: the store's calls are retried by `retried`."""
    import boto3
    from botocore.config import Config

    kwargs: dict[str, Any] = {}
    if settings and settings.get("endpoint_override"):
        kwargs["endpoint_url"] = f"{settings.get('scheme', 'https')}://{settings['endpoint_override']}"
    if settings and settings.get("region"):
        kwargs["region_name"] = settings["region"]
    config = Config(connect_timeout=5, read_timeout=30, retries={"max_attempts": 2, "mode": "standard"})
    return boto3.session.Session().client("s3", config=config, **kwargs)


def abort_uploads(root: str, key: str, deadline_s: float, exact: bool = False) -> list[str]:
    """Abort the unfinished multipart uploads of `key` (a bucket/key path; `exact`: that object only, else every key
    under it), which a failed or killed upload leaves behind (invisible, but stored and billed); S3 only (GCS's
    resumable uploads expire by themselves). Best effort: the keys aborted, [] when the store cannot say."""
    if Location.parse(root).family != "s3":
        return []
    bucket, _, prefix = key.partition("/")
    if not exact:
        prefix = prefix.rstrip("/") + "/"
    client = s3_client(fs_settings(root))
    aborted = []
    try:
        listing = retried(lambda: client.list_multipart_uploads(Bucket=bucket, Prefix=prefix), deadline_s)
        for upload in listing.get("Uploads", []):
            if exact and upload["Key"] != prefix:
                continue
            retried(lambda u=upload: _abort(client, bucket, u["Key"], u["UploadId"]), deadline_s)
            aborted.append(f"{bucket}/{upload['Key']}")
    except GaveUp as g:
        logger.warning("could not abort unfinished uploads under %s/%s: %s", bucket, prefix, g.error)
    return aborted


def _abort(client, bucket: str, key: str, upload_id: str) -> None:
    """Abort one multipart upload. NoSuchUpload means it is gone already: done (an earlier try's abort landed and its
    answer was lost, or another writer aborted it), never a failure to retry."""
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except Exception as exc:
        if not no_such_upload(exc):
            raise
