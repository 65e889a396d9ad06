"""Files at a location, local or on object storage, for the jobs that keep things beside the runs (the pipeline's
report root and run listings): one call whatever the backend (pyarrow's filesystem of the Location)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from .uri import Location


def location_fs(location: str | os.PathLike | Location) -> tuple[Any, str]:
    """(pyarrow FileSystem, path inside it) of a local path or an object-store URI."""
    return Location.parse(location).filesystem()


def join(location: str | os.PathLike | Location, relative: str) -> Location:
    """`location/relative`."""
    return Location.parse(location).join(relative)


def is_file(location: str | os.PathLike | Location) -> bool:
    import pyarrow.fs as pafs

    fs, path = location_fs(location)
    return fs.get_file_info(path).type == pafs.FileType.File


def read_text(location: str | os.PathLike | Location) -> str | None:
    """The UTF-8 text of the file at `location`, None when there is none."""
    if not is_file(location):
        return None
    fs, path = location_fs(location)
    with fs.open_input_stream(path) as fh:
        return fh.read().decode("utf-8")


def upload(source: Path, location: str | Location) -> None:
    """Copy the local file or folder `source` to the `location` (object storage), over what was there (a folder's old
    objects are deleted first)."""
    import pyarrow.fs as pafs

    fs, target = location_fs(location)
    if source.is_dir():
        fs.delete_dir_contents(target, missing_dir_ok=True)
        pafs.copy_files(str(source), target, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    else:
        with fs.open_output_stream(target) as fh:
            fh.write(source.read_bytes())
