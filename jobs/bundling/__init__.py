"""Offline bundles, the machinery of `python -m jobs.bundle` (docs/OFFLINE.md): everything the job needs on a
machine with Python but no network, in parts of a chosen size.

    installer.py   the parts (split, check, join), float16 weights, and the bundle's own install.py (this very file,
                   copied into every bundle: standard library only)
    wheels.py      the project's dependencies resolved and downloaded for the target by pip; the project's wheel
    items.py       the model folders and dataset files a bundle carries
    write.py       `bundle`: all of it into a folder, with its manifest (jobs.bundling.write.bundle)

The parts themselves, for a tool that carries other files the same way (bench/paper_gpu.py, bench/gpu_train.py):
`split_file` cuts a file into parts and gives its manifest item (sha256, size, parts), `check_parts` checks every
part of some items against their manifest, `join_parts` reassembles one item, `sha256_file` hashes a file, and
`install` installs a bundle's items into a folder; each stops with a BundleError saying what is wrong. They are the
installer's, standard library only, and so is importing this package (jobs.config reads --factor-memory with
parse_size): the writing half, which reaches into pip and the datasets, is imported from write.py where it is used.
"""

from .installer import BundleError, check_parts, install, join_parts, parse_size, sha256_file, split_file

__all__ = ["BundleError", "check_parts", "install", "join_parts", "parse_size", "sha256_file", "split_file"]
