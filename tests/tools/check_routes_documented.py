#!/usr/bin/env python3
"""Every HTTP route the server registers is documented: each path of the JSON API table
(kApiRoutes), each civetweb handler and each path Route tells apart in
server/frontends/kserve_http.cc appears in docs/api.md and in the door table of
docs/architecture.md. --self-test proves an undocumented route fails.

usage: check_routes_documented.py REPO_ROOT | --self-test
"""
import pathlib
import re
import sys
import tempfile

SOURCE = "server/frontends/kserve_http.cc"
DOCS = ("docs/api.md", "docs/architecture.md")

# A route table row {"/path", ...}, a handler registration, a compare in Route.
PATTERNS = (
    re.compile(r'^\s*\{"(/[a-z0-9_/]+)",\s*EmbeddingsCall::Api::', re.M),
    re.compile(r'mg_set_request_handler\([^,]+,\s*"(/[a-z0-9_/]*)\$?"'),
    re.compile(r'uri == "(/[a-z0-9_/]+)"'),
)


def routes(source: str) -> set:
    found = set()
    for pattern in PATTERNS:
        found.update(pattern.findall(source))
    return found


def documented(route: str, doc: str) -> bool:
    # As code: `/embed`, `POST /embed`, `/v2/rerank` (Cohere, ...), `/info?model=`.
    return re.search(r"`(?:[A-Z]+ )?" + re.escape(route) + r"(?:[`?{/ ]|$)", doc) is not None


def check(root: pathlib.Path) -> list:
    source = (root / SOURCE).read_text()
    found = routes(source)
    if not found:
        return [f"{SOURCE}: no routes found (has the table moved?)"]
    problems = []
    for doc_path in DOCS:
        doc = (root / doc_path).read_text()
        for route in sorted(found):
            if not documented(route, doc):
                problems.append(f"{doc_path}: route {route} ({SOURCE}) is not documented")
    return problems


def self_test() -> int:
    root = pathlib.Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as scratch:
        copy = pathlib.Path(scratch)
        for path in (SOURCE, *DOCS):
            (copy / path).parent.mkdir(parents=True, exist_ok=True)
            (copy / path).write_text((root / path).read_text())
        if check(copy):
            print("check_routes_documented: the tree itself fails", file=sys.stderr)
            return 1
        source = (copy / SOURCE).read_text().replace(
            "constexpr ApiRoute kApiRoutes[] = {",
            "constexpr ApiRoute kApiRoutes[] = {\n"
            '    {"/undocumented", EmbeddingsCall::Api::kTei, ParseTeiEmbed},', 1)
        (copy / SOURCE).write_text(source)
        problems = check(copy)
        if len(problems) != len(DOCS) or "/undocumented" not in problems[0]:
            print(f"check_routes_documented: an undocumented route passed: {problems}",
                  file=sys.stderr)
            return 1
    print("check_routes_documented: an undocumented route fails")
    return 0


def main() -> int:
    if sys.argv[1:] == ["--self-test"]:
        return self_test()
    problems = check(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "."))
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print("check_routes_documented: every route is documented")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
