#!/usr/bin/python3
"""Checks the links of the user docs (README.md and docs/*.md): every relative link
names a file of the repository, and every #anchor a heading of its page, slugged as
GitHub renders headings. External links (http:, https:, mailto:) are not followed: the
machines that run this reach no web.

usage: check_links.py ROOT          exit 1 naming each broken link
       check_links.py --self-test   proves the check fails on a broken file and anchor
"""
import os
import re
import sys
import tempfile

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def slug(heading):
    """GitHub's anchor for a heading: lowercase, markup and punctuation dropped (not
    '-' or '_'), each space a '-'."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path):
    """The anchors a page defines (duplicates get -1, -2, ... as GitHub numbers them)."""
    seen, result = {}, set()
    in_fence = False
    with open(path, encoding="utf-8") as page:
        for line in page:
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            match = None if in_fence else HEADING.match(line)
            if not match:
                continue
            base = slug(match.group(2))
            count = seen.get(base, 0)
            seen[base] = count + 1
            result.add(base if count == 0 else f"{base}-{count}")
    return result


def links(path):
    """(line number, target) of each inline link outside code."""
    found = []
    in_fence = False
    with open(path, encoding="utf-8") as page:
        for number, line in enumerate(page, 1):
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            line = re.sub(r"`[^`]*`", "", line)
            found += [(number, target) for target in LINK.findall(line)]
    return found


def broken_links(root):
    pages = [os.path.join(root, "README.md")]
    docs = os.path.join(root, "docs")
    if os.path.isdir(docs):
        pages += sorted(os.path.join(docs, name) for name in os.listdir(docs)
                        if name.endswith(".md"))
    problems = []
    for page in pages:
        if not os.path.exists(page):
            continue
        for number, target in links(page):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue
            where = f"{os.path.relpath(page, root)}:{number}: ({target})"
            file_part, _, anchor = target.partition("#")
            linked = page if not file_part else os.path.normpath(
                os.path.join(os.path.dirname(page), file_part))
            if not os.path.exists(linked):
                problems.append(f"{where}: no file {os.path.relpath(linked, root)}")
            elif anchor and linked.endswith(".md") and anchor not in anchors(linked):
                problems.append(f"{where}: no heading #{anchor} in "
                                f"{os.path.relpath(linked, root)}")
    return problems, len(pages)


def self_test():
    with tempfile.TemporaryDirectory() as root:
        os.mkdir(os.path.join(root, "docs"))
        with open(os.path.join(root, "docs", "a.md"), "w") as page:
            page.write("# A page\n\n## The `make` targets\n\n```sh\n# not a heading\n```\n")
        cases = {
            "good": ("[a](docs/a.md) [b](docs/a.md#the-make-targets) [c](#top) "
                     "[d](https://example.org/x) `[e](nowhere.md)`\n# Top\n", 0),
            "missing file": ("[a](docs/absent.md)\n", 1),
            "missing anchor": ("[a](docs/a.md#no-such-heading)\n", 1),
            "missing anchor on the page": ("[a](#gpu)\n# Models\n", 1),
            "anchor of a code comment": ("[a](docs/a.md#not-a-heading)\n", 1),
        }
        for name, (text, expected) in cases.items():
            with open(os.path.join(root, "README.md"), "w") as readme:
                readme.write(text)
            problems, _ = broken_links(root)
            if len(problems) != expected:
                print(f"check_links self-test: {name}: expected {expected} problems, got "
                      f"{problems}", file=sys.stderr)
                return 1
    print("check_links self-test: broken files and anchors are caught")
    return 0


def main():
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    problems, pages = broken_links(sys.argv[1])
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"check_links: every link of {pages} pages resolves")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
