#!/usr/bin/env python3
"""The failure tables of the docs, generated from sdk/fault-vectors.json.

docs/sdk.md and the READMEs of the Python and TypeScript SDKs hold the
tables of SPEC §11.11 (faults), §11.10 (the Reconciler) and §8 (the
middleware) between markers:

    <!-- fault-table:fault -->
    ... generated ...
    <!-- /fault-table:fault -->

(`fault`, `reconciler`, `middleware`, and `kinds` for the result kinds).
`python3 sdk/tools/fault_tables.py` rewrites them; `--check` fails (exit 1)
when a file differs from what the vectors say, naming it: the SDK suites
run the check, so docs and SDKs cannot drift.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VECTORS = ROOT / "sdk" / "fault-vectors.json"
FILES = [
    ROOT / "docs" / "sdk.md",
    ROOT / "sdk" / "python" / "README.md",
    ROOT / "sdk" / "typescript" / "README.md",
]
MARKER = re.compile(
    r"(<!-- fault-table:(?P<name>[a-z]+) -->\n)(?P<body>.*?)(<!-- /fault-table:(?P=name) -->)",
    re.S,
)


def cell(text: str | None) -> str:
    return (text or "").replace("|", "\\|").replace("\n", " ")


def scenarios_of(vectors: dict, row_id: str) -> str:
    ids = [s["id"] for s in vectors["scenarios"] if s["row"] == row_id]
    return ", ".join(f"`{i}`" for i in ids)


def table(vectors: dict, name: str) -> str:
    note = (
        "_Generated from `sdk/fault-vectors.json` by `sdk/tools/fault_tables.py`; "
        "every SDK runs the scenarios named in the last column._\n\n"
    )
    if name == "kinds":
        lines = ["| result kind | what each SDK gives |", "|---|---|"]
        for kind, what in vectors["result_kinds"].items():
            lines.append(f"| `{cell(kind)}` | {cell(what)} |")
        return note + "\n".join(lines) + "\n"
    rows = [r for r in vectors["rows"] if r["table"] == name]
    if not rows:
        raise SystemExit(f"no rows for table {name!r} in {VECTORS}")
    if name == "fault":
        lines = [
            "| where | fault | record afterwards | result kind [middleware] | scenarios |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            result = cell(r["result"])
            if r.get("middleware"):
                result += f" [{cell(r['middleware'])}]"
            lines.append(
                f"| {cell(r['where'])} | {cell(r['fault'])} | {cell(r['record'])} | {result} | "
                f"{scenarios_of(vectors, r['id'])} |"
            )
    else:
        lines = [
            "| where | situation | record afterwards | what the caller gets | scenarios |",
            "|---|---|---|---|---|",
        ]
        for r in rows:
            lines.append(
                f"| {cell(r['where'])} | {cell(r['fault'])} | {cell(r['record'])} | {cell(r['result'])} | "
                f"{scenarios_of(vectors, r['id'])} |"
            )
    return note + "\n".join(lines) + "\n"


def render(text: str, vectors: dict) -> str:
    return MARKER.sub(
        lambda m: m.group(1) + table(vectors, m.group("name")) + m.group(4), text
    )


def main(argv: list[str]) -> int:
    check = "--check" in argv
    vectors = json.loads(VECTORS.read_text(encoding="utf-8"))
    stale = []
    for f in FILES:
        text = f.read_text(encoding="utf-8")
        if not MARKER.search(text):
            stale.append(f"{f.relative_to(ROOT)}: no fault-table markers")
            continue
        new = render(text, vectors)
        if new != text:
            if check:
                stale.append(f"{f.relative_to(ROOT)}: its failure tables differ from sdk/fault-vectors.json")
            else:
                f.write_text(new, encoding="utf-8")
                print(f"rewrote {f.relative_to(ROOT)}")
    if stale:
        for s in stale:
            print(s, file=sys.stderr)
        if check:
            print("run: python3 sdk/tools/fault_tables.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
