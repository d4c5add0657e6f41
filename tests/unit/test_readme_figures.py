"""The README's results table says where the server stands today, and nothing in it is typed by hand
(issue 34): every row cites one results file, that file states when and on what it was measured,
and every number in the row's figure column is written in that file. docs/benchmarks/ holds one
page per benchmark, the latest run, not dated copies of it.

The convention the results pages follow (the benchmarks write it: benchmarks/harness.py date_line
and machine_line): a line `Date: YYYY-MM-DD ...` and a line `Machine: <CPU model or GPU> ...`. A
page holding the latest run of more than one configuration has one pair per section. Model cards
are the source for quality figures (BLEU), which do not depend on the machine."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit  # the fast layer: `make test-fast`

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
RESULTS = ROOT / "docs" / "benchmarks"
SECTION = "## Where it stands"
MODEL_CARD = re.compile(r"^models/pretrained/[^/]+/MODEL_CARD\.md$")
DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
# A figure: digits, thousands separated by commas, an optional decimal part; not part of a word
# ("fp32", "int8" and "x2" are names, not figures). A trailing unit ("0.77x", "40.1 ms") is fine.
NUMBER = re.compile(r"(?<![\w.,])\d+(?:,\d{3})*(?:\.\d+)?(?![\d]|\.\d|,\d)")
# Who made the processor: what a Machine line must name (a bare "x86_64, 2 cores" says nothing).
MAKER = re.compile(r"\b(AMD|Intel|NVIDIA|Apple|Ampere|Graviton|Arm|ARM)\b(?:\(R\))?\s+([\w-]+)")


def results_table(text: str) -> list[dict[str, str]]:
    """The rows of the first table after the results heading, keyed by the header's column names."""
    assert SECTION in text, f"README has no '{SECTION}' section"
    lines = text.split(SECTION, 1)[1].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    table = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        table.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    header, rows = [h.split(" (")[0].strip().lower() for h in table[0]], table[2:]
    return [dict(zip(header, row)) for row in rows]


def written(number: str, text: str) -> bool:
    """`number` stands in `text` as a number of its own (0.8 is not found in 0.80, nor 32 in fp32)."""
    return re.search(rf"(?<![\w.,]){re.escape(number)}(?![\d]|\.\d|,\d)", text) is not None


def source_of(row: dict[str, str]) -> str:
    return row["source"].strip("` ")


def stamped(text: str) -> tuple[list[str], list[str]]:
    """The dates of the `Date:` lines and the text of the `Machine:` lines of a results page."""
    dates = [m.group(0) for line in text.splitlines() if line.startswith("Date:")
             for m in [DATE.search(line)] if m]
    machines = [line[len("Machine:"):].strip() for line in text.splitlines() if line.startswith("Machine:")]
    return dates, machines


ROWS = results_table(README.read_text(encoding="utf-8"))


def test_the_table_has_the_columns_and_rows_a_reader_needs():
    assert len(ROWS) >= 5, ROWS
    for column in ("what", "figure", "date", "machine", "peer and its settings", "command", "source"):
        assert all(column in row for row in ROWS), f"README results table lacks the column '{column}'"


@pytest.mark.parametrize("row", ROWS, ids=[r["what"][:50] for r in ROWS])
def test_every_figure_comes_from_a_dated_results_file(row):
    source = source_of(row)
    path = ROOT / source
    assert path.is_file(), f"{source}: cited by the README, not in the repository"
    is_card = MODEL_CARD.match(source) is not None
    assert is_card or source.startswith("docs/"), f"{source}: results come from docs/ or a model card"
    text = path.read_text(encoding="utf-8")

    numbers = NUMBER.findall(row["figure"])
    assert numbers, f"row '{row['what']}' has no figure"
    missing = [n for n in numbers if not written(n, text)]
    assert not missing, f"{source} does not state {missing} (README row '{row['what']}': {row['figure']})"

    date = DATE.search(row["date"])
    if is_card:  # quality does not depend on the machine; a date, where the row gives one, is the card's
        assert date is None or date.group(0) in text, f"{source} does not mention {date.group(0)}"
        return
    assert date, f"row '{row['what']}' has no date"
    dates, machines = stamped(text)
    assert dates, f"{source} has no 'Date: YYYY-MM-DD' line"
    assert date.group(0) in dates, f"README says {date.group(0)}, {source} says {dates}"
    assert machines, f"{source} has no 'Machine:' line"
    makers = {" ".join(m.groups()) for line in machines for m in MAKER.finditer(line)}
    assert makers, f"{source}: its Machine lines name no CPU model or GPU: {machines}"
    assert any(name in row["machine"] for name in makers), \
        f"README row '{row['what']}' says machine '{row['machine']}', {source} says {sorted(makers)}"
    for command in re.findall(r"`([^`]+)`", row["command"]):
        assert command in text, f"{source} does not show the command `{command}`"


def pages() -> list[Path]:
    return sorted(p for p in RESULTS.rglob("*.md") if p.name != "README.md" or p.parent != RESULTS)


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(RESULTS)))
def test_every_results_page_says_when_and_on_what(page):
    dates, machines = stamped(page.read_text(encoding="utf-8"))
    assert dates and machines, f"{page.relative_to(ROOT)}: needs 'Date: YYYY-MM-DD' and 'Machine: ...' lines"
    # A run whose CPU model nobody recorded says so (and the README cites none of those).
    assert all(MAKER.search(m) or "not recorded" in m for m in machines), \
        f"{page.relative_to(ROOT)}: a Machine line names no CPU or GPU"


def test_one_page_per_benchmark_no_dated_or_variant_copies():
    """Earlier runs live in git history (docs/benchmarks/README.md names their commits), not beside
    the latest one as serving_load_2026-11-24.md, serving_compare_v2.md or serving_load_zen3.md."""
    problems = []
    for folder in [RESULTS, *(p for p in RESULTS.rglob("*") if p.is_dir())]:
        entries = [p for p in folder.iterdir() if p.name != "README.md"]
        page_stems = {p.stem for p in entries if p.suffix == ".md"}  # a page's data and plot share its stem
        for p in entries:
            stem = p.name.split(".", 1)[0]
            if DATE.search(p.name) or re.search(r"_v\d+$", stem):
                problems.append(f"{p.relative_to(ROOT)}: a dated or versioned copy")
            elif any(stem != other and stem.startswith(other + "_") for other in page_stems):
                problems.append(f"{p.relative_to(ROOT)}: a variant of another page in {folder.relative_to(ROOT)}")
    assert not problems, "\n".join(problems)
