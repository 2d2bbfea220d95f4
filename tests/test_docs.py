"""The documentation builds and its links lead somewhere.

* Sphinx builds docs/ (MyST Markdown pages and the API reference generated
  from the docstrings) with warnings as errors, so a broken cross-reference,
  a page left out of every toctree or a malformed docstring fails here;
* every relative link in docs/**/*.md and README.md names a file that
  exists, and a ``#fragment`` into a Markdown file names one of its headings
  (GitHub's anchor rule), so the pages also work where they are read
  unbuilt.
"""
import re
import subprocess
import sys

import pytest

from harness import REPO

DOCS = REPO / "docs"
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(`+).*?\1")


def _markdown_files():
    return sorted(DOCS.rglob("*.md")) + [REPO / "README.md"]


def _prose_lines(path, keep_code=False):
    """(line number, text) of the lines outside fenced code; code spans blanked
    unless keep_code (headings' anchors use their text)."""
    fenced = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield n, line if keep_code else CODE_SPAN.sub("", line)


def _slug(heading):
    """GitHub's anchor of a heading: inline markup and punctuation dropped,
    lowercase, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)   # links: their text
    text = re.sub(r"[^\w\- ]", "", text.strip().lower())
    return text.replace(" ", "-")


def _anchors(path):
    seen, out = {}, set()
    for _, line in _prose_lines(path, keep_code=True):
        m = re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if m:
            base = _slug(m.group(2))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    return out


def _broken_links():
    broken = []
    for md in _markdown_files():
        for n, line in _prose_lines(md):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):   # http:, mailto:, ...
                    continue
                path, _, frag = target.partition("#")
                dest = (md.parent / path).resolve() if path else md
                where = f"{md.relative_to(REPO)}:{n}: {target}"
                if not dest.exists():
                    broken.append(f"{where} (no such file)")
                elif frag and dest.suffix == ".md" and frag not in _anchors(dest):
                    broken.append(f"{where} (no heading with that anchor)")
    return broken


def test_relative_links_exist():
    broken = _broken_links()
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_link_checker_sees_a_broken_link(tmp_path, monkeypatch):
    """The checker itself: a missing file and a missing anchor are reported."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.md").write_text(
        "# Title\n\n## A section\n\n[ok](#a-section) [file](b.md) [gone](c.md)\n"
        "[bad anchor](a.md#nowhere)\n```\n[in code](d.md)\n```\n", encoding="utf-8")
    (tmp_path / "docs" / "b.md").write_text("# B\n", encoding="utf-8")
    (tmp_path / "README.md").write_text("[docs](docs/a.md#title)\n", encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    monkeypatch.setattr(sys.modules[__name__], "DOCS", tmp_path / "docs")
    broken = _broken_links()
    assert len(broken) == 2, broken
    assert "c.md (no such file)" in broken[0] and "nowhere" in broken[1]


def test_sphinx_builds_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("myst_parser")
    out = tmp_path / "html"
    r = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
        cwd=REPO, capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, f"sphinx-build failed:\n{r.stdout}\n{r.stderr}"
    api = (out / "api" / "mpi.html").read_text(encoding="utf-8")
    # the reference really comes from the code: a method and its docstring
    assert 'id="erdmampi.MPI.Comm.Send"' in api
    assert (out / "architecture.html").exists() and (out / "getting-started.html").exists()
