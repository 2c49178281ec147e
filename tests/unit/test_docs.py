"""The docs: the README stays a front page, and every relative link in it and in docs/ resolves.

A relative link must name a file or folder of the tree; a `#fragment` into a Markdown file must
name one of its headings, slugged as GitHub does (lower case, punctuation but `-` and `_` dropped,
spaces to `-`, `-1`, `-2`, ... for repeats). Links inside code (fenced blocks, `inline`) are text.
"""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README_MAX_LINES = 300
FIRST_SCREEN_LINES = 60

_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


def markdown_files():
    return [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))


def prose(text: str) -> str:
    """The text outside code blocks and inline code."""
    return _INLINE_CODE.sub("", _FENCE.sub("", text))


def slug(heading: str) -> str:
    text = _INLINE_CODE.sub(lambda m: m.group(0)[1:-1], heading.strip().lower())
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set:
    seen, out = {}, set()
    for line in _FENCE.sub("", path.read_text()).splitlines():
        m = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        s = slug(m.group(1))
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out


def broken_links(path: Path, root: Path = ROOT) -> list:
    """Each relative link of `path` that names no file of `root`'s tree, or no heading there."""
    bad = []
    for target in _LINK.findall(prose(path.read_text())):
        if _SCHEME.match(target):
            continue
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        if not dest.exists() or root.resolve() not in (dest, *dest.parents):
            bad.append(f"{path.relative_to(root)}: {target} (no such file in the tree)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            bad.append(f"{path.relative_to(root)}: {target} (no heading #{fragment} in "
                       f"{dest.relative_to(root.resolve())})")
    return bad


def test_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines, more than {README_MAX_LINES}: move the detail to a "
        "guide in docs/ and link it")
    first_screen = "\n".join(lines[:FIRST_SCREEN_LINES])
    for command in ("make demo", "make test"):
        assert command in first_screen, (
            f"README.md: `{command}` is not within its first {FIRST_SCREEN_LINES} lines")


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(path):
    bad = broken_links(path)
    assert not bad, "\n".join(bad)


def test_a_broken_link_or_anchor_is_found(tmp_path):
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (tmp_path / "outside.md").write_text("# Outside\n")
    (root / "docs" / "A.md").write_text(
        "# Title\n\n## The `make demo` output (2 workers)\n\n## Again\n\n## Again\n")
    page = root / "README.md"
    page.write_text(
        "[ok](docs/A.md) [ok](docs/A.md#the-make-demo-output-2-workers) [ok](docs/A.md#again-1)\n"
        "[ok](#top) [ok](https://example.org/x.md) [ok](docs/)\n"
        "`[code](missing.md)`\n```\n[code](missing.md)\n```\n"
        "[gone](docs/B.md) [no anchor](docs/A.md#nothing) [outside](../outside.md)\n# Top\n")
    bad = broken_links(page, root)
    assert [b.split(": ", 1)[1].split(" (")[0] for b in bad] == [
        "docs/B.md", "docs/A.md#nothing", "../outside.md"]
