"""The writer lock of a run on object storage (docs/STORE.md, "On object storage")."""

from __future__ import annotations

import os

from .clients import s3_client
from .uri import env_seconds, gcs_emulator

LOCK_NAME = "_lock.json"
LOCK_TTL_S = 120.0  # how long a writer lock lasts unless renewed (XSBERT_LOCK_TTL_S): lock_ttl_s()
LOCK_READ_TRIES = 4  # reads of the lock by a part writer before an unreadable body counts as "not this run's"


def lock_ttl_s() -> float:
    """How long a writer lock lasts unless its heartbeat renews it: XSBERT_LOCK_TTL_S, else LOCK_TTL_S."""
    return env_seconds("XSBERT_LOCK_TTL_S", LOCK_TTL_S, positive=True)


def lock_expiry() -> int:
    """When a lock written now expires: whole seconds, so that every body of one writer's lock has the same
    length (a reader that sizes the object first, as pyarrow does, and races a renewal still reads a whole body)."""
    import math
    import time as _time

    return math.ceil(_time.time() + lock_ttl_s())


class LockObject:
    """The run's writer-lock object, through the storage's own client (pyarrow has no conditional writes):
    read it, create it only if absent, overwrite it (heartbeat), delete it. S3: boto3, If-None-Match: *.
    GCS: google-cloud-storage, ifGenerationMatch=0."""

    def __init__(self, family: str, bucket: str, key: str) -> None:
        self.family, self.bucket, self.key = family, bucket, key

    def _blob(self):
        from google.cloud import storage

        emulator = gcs_emulator()
        if emulator:
            from google.auth.credentials import AnonymousCredentials

            client = storage.Client(project=os.environ.get("GOOGLE_CLOUD_PROJECT") or "emulator",
                                    credentials=AnonymousCredentials(), client_options={"api_endpoint": emulator})
        else:
            client = storage.Client()
        return client.bucket(self.bucket).blob(self.key)

    def read(self) -> bytes | None:
        """The lock's body, None when there is none."""
        if self.family == "gcs":
            from google.api_core.exceptions import NotFound

            try:
                return self._blob().download_as_bytes()
            except NotFound:
                return None
        client = s3_client()
        try:
            return client.get_object(Bucket=self.bucket, Key=self.key)["Body"].read()
        except client.exceptions.NoSuchKey:
            return None

    def create(self, body: bytes) -> bool:
        """Create the object only if absent; False when it exists (another writer has the lock)."""
        if self.family == "gcs":
            from google.api_core.exceptions import PreconditionFailed

            try:
                self._blob().upload_from_string(body, content_type="application/json", if_generation_match=0)
            except PreconditionFailed:
                return False
            return True
        from botocore.exceptions import ClientError

        try:
            s3_client().put_object(Bucket=self.bucket, Key=self.key, Body=body, IfNoneMatch="*",
                                    ContentType="application/json")  # fmt: skip
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "")
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if code in ("PreconditionFailed", "ConditionalRequestConflict") or status in (409, 412):
                return False
            raise
        return True

    def put(self, body: bytes) -> None:
        if self.family == "gcs":
            self._blob().upload_from_string(body, content_type="application/json")
        else:
            s3_client().put_object(Bucket=self.bucket, Key=self.key, Body=body, ContentType="application/json")

    def delete(self) -> None:
        if self.family == "gcs":
            from google.api_core.exceptions import NotFound

            try:
                self._blob().delete()
            except NotFound:
                pass
        else:
            s3_client().delete_object(Bucket=self.bucket, Key=self.key)
