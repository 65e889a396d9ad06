"""Files at a location, local or on object storage, for the jobs that keep things beside the runs (the pipeline's
report root and run listings): one call whatever the backend."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .uri import filesystem, is_remote


def location_fs(location: str | os.PathLike) -> tuple[Any, str]:
    """(pyarrow FileSystem, path inside it) of a local path or an object-store URI."""
    import pyarrow.fs as pafs

    if is_remote(location):
        return filesystem(str(location))
    return pafs.LocalFileSystem(), str(Path(location).resolve())


def join(location: str | os.PathLike, relative: str) -> str | Path:
    """`location/relative`: a URI for an object-store location, else a Path."""
    return f"{str(location).rstrip('/')}/{relative}" if is_remote(location) else Path(location) / relative


def is_file(location: str | os.PathLike) -> bool:
    import pyarrow.fs as pafs

    if not is_remote(location):
        return Path(location).is_file()
    fs, path = filesystem(str(location))
    return fs.get_file_info(path).type == pafs.FileType.File


def read_text(location: str | os.PathLike) -> str | None:
    """The UTF-8 text of the file at `location`, None when there is none."""
    if not is_file(location):
        return None
    if not is_remote(location):
        return Path(location).read_text(encoding="utf-8")
    fs, path = filesystem(str(location))
    with fs.open_input_stream(path) as fh:
        return fh.read().decode("utf-8")


def upload(source: Path, location: str) -> None:
    """Copy the local file or folder `source` to the object-store `location`, over what was there (a folder's old
    objects are deleted first)."""
    import pyarrow.fs as pafs

    fs, target = filesystem(location)
    if source.is_dir():
        fs.delete_dir_contents(target, missing_dir_ok=True)
        pafs.copy_files(str(source), target, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    else:
        with fs.open_output_stream(target) as fh:
            fh.write(source.read_bytes())
