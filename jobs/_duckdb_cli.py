"""The duckdb CLI (PyPI `duckdb-cli`) and its httpfs extension (PyPI `duckdb-extension-httpfs`), offline.

The CLI reads runs on S3 through httpfs, which DuckDB would download on first use; here it comes from PyPI:
`duckdb-extension-httpfs` ships the official (DuckDB-signed) build for one DuckDB version, so its version must
equal the CLI's (pinned together: pyproject.toml and the Makefile). `install_httpfs` copies it, with the CLI's own
`INSTALL '<file>'`, into `<site-packages>/.duckdb_extensions`: the extension directory that the CLI's launcher
(`.venv/bin/duckdb`) adds to `extension_directories`, so `LOAD httpfs` (and autoloading on `s3://`) finds it.

    python -m jobs._duckdb_cli          # install (idempotent; `make setup` runs it), print the paths
    .venv/bin/duckdb -cmd ".read sql/init/s3.sql" -cmd "set variable run = 's3://bucket/prefix/<run id>'" -f sql/table1.sql

sql/init/s3.sql loads httpfs and makes an S3 secret from the standard AWS_* variables (AWS_ENDPOINT_URL for a
non-AWS endpoint). The package pins the Python `duckdb` to its version too, which is not what this project's
Python side uses (it reads object storage through pyarrow, jobs/sqlrun/): the Makefile installs it --no-deps.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path

from xsbert_core import InputError
from xsbert_core.errors import CommandParser, command_name, exit_status

from .sqlfiles import INIT_DIR, SQL_DIR

# Read first (-cmd ".read sql/init/s3.sql") for runs on S3; not an analysis (sql/*.sql are, sql/init/ is not).
# Not -init: the CLI runs that before the launcher's -cmd that adds the extension directory.
S3_INIT = INIT_DIR / "s3.sql"
HTTPFS_PACKAGE = "duckdb-extension-httpfs"
HTTPFS_MODULE = "duckdb_extension_httpfs"
EXTENSION = "httpfs.duckdb_extension"


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _install_hint(version: str) -> str:
    return f"python -m pip install --no-deps {HTTPFS_PACKAGE}=={version} && python -m jobs._duckdb_cli"


def cli_version() -> str:
    """The duckdb-cli package's version, e.g. '1.5.5' (InputError when it is not installed)."""
    version = _version("duckdb-cli")
    if version is None:
        raise InputError("the duckdb CLI is not installed: python -m pip install duckdb-cli (see pyproject.toml)")
    return version


def cli_binary() -> Path:
    """The CLI executable itself (not the launcher script in .venv/bin, which adds the extension directory)."""
    spec = importlib.util.find_spec("duckdb_cli")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the duckdb CLI is not installed: python -m pip install duckdb-cli (see pyproject.toml)")
    binary = Path(next(iter(spec.submodule_search_locations))) / ("duckdb.exe" if sys.platform == "win32" else "duckdb")
    if not binary.is_file():
        raise InputError(f"the duckdb-cli package has no executable at {binary}")
    return binary


def cli_extension_dir() -> Path:
    """`<site-packages>/.duckdb_extensions`: where the CLI's launcher looks for extensions (duckdb_cli/__main__.py)."""
    return cli_binary().parent.parent / ".duckdb_extensions"


def httpfs_extension() -> Path:
    """The httpfs build that the installed duckdb-extension-httpfs ships for the installed CLI's version."""
    version = cli_version()
    have = _version(HTTPFS_PACKAGE)
    if have is None:
        raise InputError(f"the duckdb CLI reads s3:// through httpfs, which is not installed: {_install_hint(version)}")
    if have != version:
        raise InputError(
            f"duckdb-cli {version} needs {HTTPFS_PACKAGE}=={version}, not {have}: {_install_hint(version)}"
        )
    spec = importlib.util.find_spec(HTTPFS_MODULE)
    folder = Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else None
    found = sorted(folder.glob(f"extensions/v{version}/**/{EXTENSION}")) if folder else []
    if not found:
        raise InputError(f"{HTTPFS_PACKAGE} {have} has no {EXTENSION} for v{version} (in {folder})")
    return found[0]


def installed_httpfs() -> Path | None:
    """httpfs in the CLI's extension directory (`v<version>/<platform>/httpfs.duckdb_extension`), if there."""
    found = sorted(cli_extension_dir().glob(f"v{cli_version()}/*/{EXTENSION}"))
    return found[0] if found else None


def _quote(path: Path) -> str:
    return "'" + str(path).replace("'", "''") + "'"


def install_httpfs() -> Path:
    """Put the package's httpfs into the CLI's extension directory (nothing when the same file is there already);
    returns where it is. The CLI itself installs it (`INSTALL '<file>'`): its platform folder, its metadata."""
    source = httpfs_extension()
    there = installed_httpfs()
    if there is not None and there.stat().st_size == source.stat().st_size:
        return there
    folder = cli_extension_dir()
    folder.mkdir(parents=True, exist_ok=True)
    sql = f"SET extension_directory = {_quote(folder)}; FORCE INSTALL {_quote(source)};"
    done = subprocess.run([str(cli_binary()), "-batch", "-c", sql], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, check=False)  # fmt: skip
    there = installed_httpfs()
    if done.returncode != 0 or there is None:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise InputError(f"could not install httpfs for the duckdb CLI into {folder}: {detail[0] if detail else '?'}")
    return there


def main(argv: list[str] | None = None) -> int:
    p = CommandParser(prog="python -m jobs._duckdb_cli", description=__doc__.split("\n\n")[0])
    p.add_argument("--path", action="store_true", help="print the packaged httpfs extension's path only")
    args = p.parse_args(argv)

    def run() -> None:
        if args.path:
            print(httpfs_extension())
            return
        there = install_httpfs()
        print(f"httpfs for duckdb CLI {cli_version()}: {there}")
        print(f"runs on S3: .venv/bin/duckdb -cmd \".read {S3_INIT.relative_to(SQL_DIR.parent)}\" "
              "-cmd \"set variable run = 's3://bucket/prefix/<run id>'\" -f sql/table1.sql")  # fmt: skip

    return exit_status(command_name(p.prog), run)


if __name__ == "__main__":
    sys.exit(main())
