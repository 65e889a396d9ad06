"""A real GCS endpoint on 127.0.0.1 for tests: gcp-storage-emulator (PyPI) as a subprocess, speaking GCS's JSON API.

    server = start_gcs(log_dir)                  # a free port, waits until it answers, creates the bucket
    with server.environ():                       # STORAGE_EMULATOR_HOST in os.environ (restored after)
        ...                                      # code that reads and writes gs:// the standard way
    server.listing("prefix/")                    # name -> (generation, md5) of every object under a prefix
    server.stop()

The emulator serves what pyarrow's GcsFileSystem and google-cloud-storage need (buckets, objects, listings,
multipart and resumable uploads), but it ignores the `ifGenerationMatch` precondition that the store's writer lock
relies on. Run as a script (`python tests/gcstools.py PORT`), this module starts the emulator with that
precondition added as GCS documents it for object inserts: ifGenerationMatch=0 succeeds only if the object does
not exist, ifGenerationMatch=N only if its live generation is N; otherwise HTTP 412 with reason `conditionNotMet`
(https://cloud.google.com/storage/docs/request-preconditions). Nothing else of the emulator is changed. Nothing
leaves 127.0.0.1; no credentials are involved (the emulator does not check any).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from endpoints import EnvEndpoint, free_port

# GCS settings that would change where or as whom a client talks: unset by environ() unless given.
GCS_SETTINGS = ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_CLOUD_PROJECT")


@dataclass
class GcsServer(EnvEndpoint):
    """One emulator process: its endpoint (http://127.0.0.1:PORT), a bucket in it, the environment for clients."""

    SETTINGS = GCS_SETTINGS
    family = "gcs"  # the store's backend (jobs.store.REMOTE_SCHEMES)

    endpoint: str
    bucket: str
    process: subprocess.Popen
    log: Path

    @property
    def env(self) -> dict[str, str]:
        return {"STORAGE_EMULATOR_HOST": self.endpoint, "GOOGLE_CLOUD_PROJECT": "test"}

    def uri(self, *parts: str) -> str:
        return "/".join([f"gs://{self.bucket}", *(p.strip("/") for p in parts)])

    def _get(self, path: str) -> dict:
        with urllib.request.urlopen(f"{self.endpoint}{path}", timeout=10) as response:
            return json.loads(response.read().decode())

    def listing(self, prefix: str = "") -> dict[str, tuple[str, str]]:
        """name -> (generation, md5Hash) of every live object under `prefix` (what a rerun must leave unchanged)."""
        from urllib.parse import quote

        out: dict[str, tuple[str, str]] = {}
        token = ""
        while True:
            page = self._get(f"/storage/v1/b/{self.bucket}/o?prefix={quote(prefix)}"
                             + (f"&pageToken={quote(token)}" if token else ""))  # fmt: skip
            out.update({o["name"]: (o.get("generation", ""), o.get("md5Hash", "")) for o in page.get("items", [])})
            token = page.get("nextPageToken", "")
            if not token:
                return out

    def upload(self, local: Path, prefix: str = "") -> str:
        """Copy a local folder (a run directory) to gs://<bucket>/<prefix>/<folder name>/; returns that URI."""
        import pyarrow.fs as pafs

        local = Path(local)
        base = "/".join(p for p in (self.bucket, prefix.strip("/"), local.name) if p)
        host = self.endpoint.split("://", 1)[1]
        fs = pafs.GcsFileSystem(endpoint_override=host, scheme="http", anonymous=True)
        pafs.copy_files(str(local), base, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        return f"gs://{base}"

    def create_bucket(self, name: str) -> None:
        body = json.dumps({"name": name}).encode()
        request = urllib.request.Request(f"{self.endpoint}/storage/v1/b?project=test", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10):
            pass

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def start_gcs(log_dir: Path, bucket: str = "xsbert-test") -> GcsServer:
    """Start the emulator (with the precondition) on a free port; wait until it answers; create `bucket`."""
    port = free_port()
    log = Path(log_dir) / "gcs-emulator.log"
    with open(log, "wb") as fh:
        process = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), str(port)], stdout=fh,
                                   stderr=subprocess.STDOUT)  # fmt: skip
    server = GcsServer(endpoint=f"http://127.0.0.1:{port}", bucket=bucket, process=process, log=log)
    deadline = time.monotonic() + 60
    while True:
        try:
            server._get("/storage/v1/b?project=test")
            break
        except (urllib.error.URLError, ConnectionError, OSError):
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"the GCS emulator did not start; see {log}: {log.read_text()[-2000:]}") from None
            time.sleep(0.2)
    server.create_bucket(bucket)
    return server


# --------------------------------------------------------------------------- the emulator, with preconditions
def _serve(port: int) -> None:
    import threading
    from http import HTTPStatus
    from urllib.parse import parse_qs, urlsplit

    from gcp_storage_emulator import server as emu
    from gcp_storage_emulator.storage import Storage

    current = threading.local()  # the query of the request being handled (one at a time: check and write are atomic)

    class ConditionNotMet(Exception):
        pass

    class PreconditionStorage(Storage):
        def create_file(self, bucket_name, file_name, content, file_obj, file_id=None):
            wanted = (getattr(current, "query", {}).get("ifGenerationMatch") or [None])[0]
            if wanted is not None:
                live = self.objects.get(bucket_name, {}).get(file_name)
                if (wanted == "0" and live is not None) or (
                    wanted != "0" and (live is None or str(live.get("generation")) != wanted)
                ):
                    raise ConditionNotMet(f"{bucket_name}/{file_name}")
            return super().create_file(bucket_name, file_name, content, file_obj, file_id)

    class Handler(emu.RequestHandler):
        def _handle(self, method: str) -> None:
            current.query = parse_qs(urlsplit(self.path).query)
            try:
                emu.Router(self).handle(method)
            except ConditionNotMet as exc:
                body = json.dumps({"error": {"code": 412, "message": "At least one of the pre-conditions you "
                                   "specified did not hold.", "errors": [{"reason": "conditionNotMet",
                                   "message": str(exc)}]}}).encode()  # fmt: skip
                self.send_response(HTTPStatus.PRECONDITION_FAILED)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            finally:
                current.query = {}

        def do_POST(self):
            self._handle(emu.POST)

        def do_PUT(self):
            self._handle(emu.PUT)

    from functools import partial
    from http.server import HTTPServer

    storage = PreconditionStorage(use_memory_fs=True)
    httpd = HTTPServer(("127.0.0.1", port), partial(Handler, storage))
    print(f"serving GCS (gcp-storage-emulator, with ifGenerationMatch) on 127.0.0.1:{port}", flush=True)
    httpd.serve_forever()


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
