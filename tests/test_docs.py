"""The repository's documents are where its files say they are: no tracked file cites a method document the
repository does not ship, every ``docs/*.md`` a file names exists, and every relative link of the README and the
docs resolves, down to the section heading a link names."""

import pathlib
import re
import subprocess

REPO = pathlib.Path(__file__).resolve().parents[1]
# Documents that lived outside the repository (the method notes, the house style) and are now docs/method.md and
# CONTRIBUTING.md: a file naming one points its reader at nothing.
OUTSIDE = ("SERA.md", "MAXRL.md", "STYLE.md")
# Other repositories' documents, cited as theirs (docs/allocators.md's sources).
CITED = {"docs/algo/dapo.md"}  # volcengine/verl's


def _tracked_text_files() -> list[pathlib.Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    return [REPO / n for n in names if n.endswith((".py", ".md", ".sh", ".cfg", ".toml", ".txt", ".ipynb"))
            and (REPO / n).is_file()]


def test_no_file_cites_a_document_the_repository_lacks():
    missing = []
    for path in _tracked_text_files():
        if path == pathlib.Path(__file__).resolve():  # this file names them to look for them
            continue
        text = path.read_text(errors="replace")
        for name in OUTSIDE:
            if re.search(rf"(?<![\w/.-]){re.escape(name)}", text):
                missing.append(f"{path.relative_to(REPO)}: {name}")
        for doc in set(re.findall(r"(?<![\w/.-])docs/[\w./-]+\.md", text)):
            if doc not in CITED and not (REPO / doc).is_file():
                missing.append(f"{path.relative_to(REPO)}: {doc}")
    assert not missing, "documents named but not in the repository:\n" + "\n".join(sorted(missing))


def _anchors(page: pathlib.Path) -> set[str]:
    """GitHub's anchors of a markdown page's headings (outside code blocks): lower case, punctuation dropped,
    spaces as hyphens."""
    anchors, fenced = set(), False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and re.match(r"#{1,6} ", line):
            anchors.add(re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-"))
    return anchors


def test_every_relative_link_of_the_readme_and_the_docs_resolves():
    """Every relative link points at a file that exists, and a link to a markdown page's section (``page.md#x``)
    at a heading that page has."""
    broken = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target, anchor in re.findall(r"\]\(([^)#\s]+)(?:#([^)]*))?\)", page.read_text()):
            if re.match(r"[a-z]+:", target):  # http(s), mailto: not checked here
                continue
            path = page.parent / target
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target}")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {target}#{anchor} (no such heading)")
    assert not broken, "links that resolve to nothing:\n" + "\n".join(broken)
