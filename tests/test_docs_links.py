"""Every relative link and image in the repository's Markdown points at a file the repository holds.

A figure written next to the docs but matched by .gitignore looks fine in the working tree and is missing from
every clone; this test reads what git tracks, so it fails here, not on a reader's screen."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# [text](target) and ![alt](target), the target up to a space, a '#' anchor or the closing parenthesis.
LINK = re.compile(r"!?\[[^\]]*\]\(\s*(?:<([^>#]+)[^>]*>|([^)\s#]+))")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, s3: ...


def tracked() -> set[str] | None:
    """The paths git tracks, or None outside a git checkout (an unpacked sdist: then the files on disk count)."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    return set(out.decode().split("\0")) - {""}


def local_links(text: str) -> list[str]:
    """The relative targets of a Markdown text's links and images (fenced and indented code and code spans left out)."""
    text = re.sub(r"```.*?```", "", text, flags=re.DOTALL)
    text = re.sub(r"^(?: {4}|\t).*$", "", text, flags=re.MULTILINE)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = [bracketed or bare for bracketed, bare in LINK.findall(text)]
    return [t for t in targets if not EXTERNAL.match(t)]


def test_the_scan_finds_relative_links_only():
    text = "![a](x/fig.png) [b](../y.md#part) [c](https://ray.io) [d](#anchor) `[e](z)`\n```\n[f](in-code.md)\n```"
    text += "\n\n    P[k, s] = f[s, h](x(a_n))\n[g](<docs/a b.md>)"
    assert local_links(text) == ["x/fig.png", "../y.md", "docs/a b.md"]


FILES = tracked()
MARKDOWN = sorted(p for p in (FILES or []) if p.endswith(".md") and not p.startswith("tests/data/"))


@pytest.mark.skipif(FILES is None, reason="not a git checkout")
@pytest.mark.parametrize("doc", MARKDOWN)
def test_links_point_at_tracked_files(doc):
    base = (ROOT / doc).parent
    missing = []
    for target in local_links((ROOT / doc).read_text()):
        path = (base / target).resolve()
        try:
            rel = path.relative_to(ROOT).as_posix()
        except ValueError:  # outside the repository: a reader of a clone does not have it
            missing.append(target)
            continue
        if rel not in FILES and not any(f.startswith(rel.rstrip("/") + "/") for f in FILES):
            missing.append(target)
    assert not missing, f"{doc} links to files the repository does not hold: {missing}"
