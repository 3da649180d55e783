"""The documentation is a front door (README.md, at most 250 lines) and topic pages (docs/*.md): every page is
linked from the front door and links back to it, and every relative link between them names a file and a
heading that exist, so moving a section cannot leave a link behind."""

from __future__ import annotations

import re
from pathlib import Path

from tests.conftest import REPO, doc_pages

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _headings(text: str) -> set[str]:
    """GitHub's anchors of a page's headings (fenced code is not read as headings)."""
    anchors, fence = set(), False
    for line in text.split("\n"):
        if line.startswith("```"):
            fence = not fence
        heading = None if fence else re.match(r"#+ (.*)$", line)
        if heading:
            anchors.add(re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-"))
    return anchors


def _links(path: str, text: str) -> list[tuple[Path, str]]:
    """Every relative link of a page (outside fenced code) as (target file, anchor)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    out = []
    for target in LINK.findall(prose):
        if re.match(r"[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        out.append((((REPO / path).parent / file).resolve() if file else (REPO / path).resolve(), anchor))
    return out


def test_the_readme_is_a_front_door_of_at_most_250_lines():
    lines = (REPO / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= 250, f"README.md has {lines} lines: move the depth into a docs/ page"


def test_every_docs_page_is_linked_from_the_readme_and_links_back_to_it():
    pages = doc_pages()
    front = {target for target, _ in _links("README.md", pages.pop("README.md"))}
    assert pages
    for path, text in pages.items():
        assert (REPO / path).resolve() in front, f"README.md does not link {path}"
        back = {target for target, _ in _links(path, text)}
        assert (REPO / "README.md").resolve() in back, f"{path} does not link back to ../README.md"


def test_every_relative_link_of_the_docs_names_a_file_and_heading_that_exist():
    pages = doc_pages()
    anchors = {(REPO / path).resolve(): _headings(text) for path, text in pages.items()}
    broken = []
    for path, text in pages.items():
        for target, anchor in _links(path, text):
            if not target.exists():
                broken.append(f"{path}: {target.relative_to(REPO)} does not exist")
            elif anchor and target in anchors and anchor not in anchors[target]:
                broken.append(f"{path}: no heading #{anchor} in {target.relative_to(REPO)}")
    assert not broken, "\n".join(broken)


#: a requirement that names the distribution itself: resolved by the public registry, where ``corpus-io`` is
#: another project (an install from the checkout names a path: ``pip install -e '.[deploy]'``)
BY_NAME = re.compile(r"corpus[-_.]io(\[[^\]]*\])?([<>=~!;@].*)?", re.I)


def _install_lines_by_name(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        for command in re.findall(r"pip3?\s+install\s+([^`\n#();,\"]*)", line):  # up to a comment, prose or code
            words = [w.strip("'\"(),") for w in command.split()]
            if any(BY_NAME.fullmatch(w) for w in words if w and not w.startswith("-")):
                found.append(line.strip())
    return found


def test_no_page_message_or_script_prints_an_install_line_that_resolves_to_another_project():
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), REPO / "Makefile",
             *[p for d in ("corpus_io", "cli", "recipes") for p in (REPO / d).rglob("*") if p.suffix in (".py", ".sh")]]
    offending = {str(p.relative_to(REPO)): found for p in files
                 if (found := _install_lines_by_name(p.read_text(encoding="utf-8", errors="replace")))}
    assert not offending, offending
    # the scan sees the forms that did resolve to the registry's corpus-io
    assert _install_lines_by_name("pip install 'corpus-io[deploy]'   # sherpa-onnx") and \
        _install_lines_by_name("(`pip install corpus-io[dask]`; `dask scheduler`)") and \
        _install_lines_by_name("| `pip install corpus-io` (the core) |")
    assert not _install_lines_by_name("pip install -e '.[deploy]'   # in the checkout")


def test_a_missing_extra_names_this_checkout_to_install_it_from():
    from corpus_io.extras import install_line, missing_extra_message

    assert install_line("deploy") == f"pip install -e '{REPO.resolve()}[deploy]'"
    message = missing_extra_message(ModuleNotFoundError("No module named 'duckdb'", name="duckdb"))
    assert f"pip install -e '{REPO.resolve()}[explore]'" in message and not _install_lines_by_name(message)
