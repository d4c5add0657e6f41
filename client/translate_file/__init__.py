"""`python -m client translate-file`: translate a whole file through one or more servers.

    python -m client translate-file corpus.txt -o corpus.de.txt --target a:50051,b:50051 --concurrency 8
    python -m client translate-file docs.jsonl --field body --output-field body_de
    python -m client translate-file pairs.tsv --column src      # a header name: the first row is a header

Input formats (--format, `auto` picks by extension: .jsonl/.ndjson, .tsv, the document formats, else text):
  text   one document per line; --whole-file makes the whole file one text
  jsonl  one JSON object per line; translates --field, writes the object back with --output-field set
  tsv    tab-separated rows; translates --column (1-based, as `cut -f`, or a header name) and appends
         the translation as a new last column
  document  .docx .pptx .xlsx .odt .odp .ods .srt .xlf/.xliff .po/.pot .html/.htm: the file read here by
         the server's readers (server/files/), its texts translated with their formatting, the file
         rebuilt and written whole (no resume; --overwrite to replace an existing OUTPUT); with
         --server-side the file is sent whole to the server's TranslateFile, which reads, translates
         and rebuilds it (no serve extra needed here; .txt too)

Every input line gives exactly one output line, in input order; empty lines and empty texts pass
through untranslated. Requests carry --batch-size texts each, at most --concurrency in flight,
spread round-robin over the targets. UNAVAILABLE and RESOURCE_EXHAUSTED are retried (--retries,
exponential back-off with jitter, on another target when there is one); when the retries run
out the run stops there (exit 1) and a rerun resumes. Any other error fails only the lines
concerned: each is written to OUTPUT.errors.jsonl, the output gets a placeholder (an empty line,
an empty TSV cell, a JSON null) so that lines stay aligned, and the run exits 1.

Resuming: the output is written in input order as lines complete, so its number of complete
lines is the number of input lines done. A rerun with the same INPUT and OUTPUT cuts any partial
last line, skips that many input lines and appends; OUTPUT.progress records the input's size and
checksum and the settings that shape the output, and a rerun with different ones is refused
(exit 2) unless --overwrite, which starts over. See docs/translate_file.md.
"""
from __future__ import annotations

# Modules, in the order the data flows: settings (arguments -> Settings), formats (input lines ->
# Units -> output lines), resume (the input's fingerprint, OUTPUT.progress, where a rerun starts),
# targets (per-target clients, round-robin, retries), runner (batching, workers, writing in order),
# report (progress, summary).
import argparse
import sys

from .document import print_document_summary, translate_document
from .report import print_summary
from .resume import write_json_atomic
from .runner import translate_file
from .settings import Settings, UsageError, settings_from_args

__all__ = ["add_arguments", "main_args", "translate_file", "print_summary", "Settings", "UsageError",
           "settings_from_args"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("input", metavar="INPUT", help="file to translate")
    p.add_argument("-o", "--output", help="output file ('-' = stdout: no resume); "
                                          "default: INPUT with '.translated' before its extension")
    p.add_argument("--format", choices=("auto", "text", "jsonl", "tsv", "document"), default="auto",
                   help="input format; auto: .jsonl/.ndjson = jsonl, .tsv = tsv, .docx .pptx .xlsx .odt .odp .ods "
                        ".srt .xlf .xliff .po .pot .html .htm = document (the file rebuilt with its formatting; "
                        "see docs/translate_file.md), anything else = text"),
    p.add_argument("--whole-file", action="store_true", help="text: the whole file is one text")
    p.add_argument("--server-side", action="store_true",
                   help="document: send the file whole in one TranslateFile call; the server reads, translates "
                        "and rebuilds it (any format the server reads, .txt included; --timeout bounds the whole "
                        "call; see docs/translate_file.md)")
    p.add_argument("--field", default="text", help="jsonl: the field to translate")
    p.add_argument("--output-field", default="translation",
                   help="jsonl: the field the translation goes to (added or overwritten); tsv: the header "
                        "of the appended column")
    p.add_argument("--column", default="1",
                   help="tsv: the column to translate, 1-based (as cut -f) or a header name (then the first "
                        "row is a header)")
    p.add_argument("--header", action="store_true",
                   help="tsv: the first row is a header (implied by a --column name); it gets --output-field "
                        "appended")
    p.add_argument("--target", dest="file_targets", action="append", metavar="HOST:PORT",
                   help="server; repeat or comma-separate for several (requests go round-robin); "
                        "default: the global --target")
    p.add_argument("--concurrency", type=int, default=4, help="Translate calls in flight")
    p.add_argument("--batch-size", type=int, default=16, help="texts per Translate call")
    p.add_argument("--model", default="", help="model name; empty = the server's default")
    p.add_argument("--beam", type=int, default=0, help="beam size; 0 = greedy")
    p.add_argument("--source-language", default="")
    p.add_argument("--target-language", default="")
    p.add_argument("--timeout", dest="file_timeout", type=float, metavar="SECONDS",
                   help="deadline of each attempt in seconds; default: the global --timeout")
    p.add_argument("--retries", type=int, default=10,
                   help="retries of a call after UNAVAILABLE or RESOURCE_EXHAUSTED")
    p.add_argument("--backoff", type=float, default=0.2,
                   help="first back-off in seconds; doubles per retry, with jitter (x0.5-1)")
    p.add_argument("--max-backoff", type=float, default=10.0, help="longest back-off in seconds")
    p.add_argument("--max-lines", type=int, help="stop after this many input lines in this run (resumable)")
    p.add_argument("--max-errors", type=int, default=0,
                   help="stop dispatching once this many lines failed in this run; 0 = never")
    p.add_argument("--overwrite", action="store_true", help="start over instead of resuming")
    p.add_argument("--errors-file", help="failed lines as JSON records (default OUTPUT.errors.jsonl; "
                                         "with -o -: none, the summary lists them)")
    p.add_argument("--summary-json", help="also write the summary to this file as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    p.add_argument("--progress-interval", type=float, default=10.0,
                   help="seconds between progress lines when stderr is not a terminal")


def main_args(args: argparse.Namespace) -> int:
    """The CLI's translate-file command: 0 done, 1 lines failed, 2 bad arguments, 130 interrupted."""
    try:
        s = settings_from_args(args)
        summary = translate_document(s) if s.format == "document" else translate_file(s)
    except UsageError as e:
        print(f"translate-file: {e}", file=sys.stderr)
        return 2
    if s.format == "document":
        print_document_summary(summary)
    else:
        print_summary(summary)
    if s.summary_json is not None:
        write_json_atomic(s.summary_json, summary)
    if summary["interrupted"]:
        return 130
    return 1 if summary["errors_total"] or summary["retries_exhausted"] or \
        summary["stopped"].startswith("--max-errors") else 0
