"""moefleet bench: SGLang benchmark results.

`moefleet bench parse FILE... [--json]` reads the results of `python -m sglang.bench_serving` as people
paste them: the printed result block of any SGLang release since 0.2 (rows missing in older releases,
older label spellings, CRLF, trimmed padding, a progress bar or the command above it, rows cut out) and
the JSON lines of its --output-file. It prints a table, or with --json a list of one object per block or
JSON line: output_throughput and the other throughputs in tok/s (request_throughput in req/s), latencies
in ms, max_concurrency null when not printed or "not set", rows it does not know under "extra".

Exit codes: 0 every file held at least one result; 2 a file held none or could not be read (a sentence
on stderr names it; the results of the other files are still printed).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ansible_collections.moefleet.serving.plugins.module_utils.bench_results import parse_text

EXIT_OK, EXIT_BAD_INPUT = 0, 2
EXPECTED = ("expected the block `python -m sglang.bench_serving` prints (from its "
            "'============ Serving Benchmark Result ============' line) or the JSON lines of its --output-file")

# (heading, field, format) of the table without --json
COLUMNS = (
    ("backend", "backend", "{}"),
    ("conc", "max_concurrency", "{}"),
    ("reqs", "successful_requests", "{}"),
    ("out tok/s", "output_throughput", "{:.2f}"),
    ("total tok/s", "total_throughput", "{:.2f}"),
    ("med TTFT ms", "median_ttft_ms", "{:.2f}"),
    ("p99 TTFT ms", "p99_ttft_ms", "{:.2f}"),
    ("med ITL ms", "median_itl_ms", "{:.2f}"),
    ("p99 ITL ms", "p99_itl_ms", "{:.2f}"),
    ("med E2E ms", "median_e2e_latency_ms", "{:.2f}"),
)


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "bench",
        help="SGLang benchmark results: parse saved or pasted bench_serving output",
        description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = parser.add_subparsers(dest="bench_command", metavar="ACTION")
    parse = actions.add_parser(
        "parse",
        help="read bench_serving result blocks and JSONL lines from files",
        description="Read `python -m sglang.bench_serving` result blocks and --output-file JSON lines.",
    )
    parse.add_argument("files", metavar="FILE", nargs="+", help="a saved or pasted output; '-' reads stdin")
    parse.add_argument("--json", action="store_true", help="print a JSON list, one object per result")
    parse.set_defaults(func=run_parse)

    def usage(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT

    parser.set_defaults(func=usage)


def _read(path: str) -> str:
    """The file's text; OSError's sentence as ValueError."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file.") from None
    except IsADirectoryError:
        raise ValueError(f"{path}: is a directory, not a file with benchmark output.") from None
    except OSError as err:
        raise ValueError(f"{path}: cannot be read ({err.strerror or err}).") from None
    return data.decode("utf-8", errors="replace")


def _cell(fmt: str, value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return fmt.format(value)


def table(results: list[dict]) -> str:
    rows = [["source", *(heading for heading, _, _ in COLUMNS)]]
    for result in results:
        rows.append([f"{result['file']}:{result['line']}",
                     *(_cell(fmt, result[field]) for _, field, fmt in COLUMNS)])
    widths = [max(len(row[k]) for row in rows) for k in range(len(rows[0]))]
    lines = []
    for n, row in enumerate(rows):
        cells = [cell.ljust(w) if k < 2 else cell.rjust(w) for k, (cell, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def run_parse(args: argparse.Namespace) -> int:
    results: list[dict] = []
    code = EXIT_OK
    for path in args.files:
        name = "stdin" if path == "-" else path
        try:
            found = parse_text(_read(path))
        except ValueError as err:
            print(f"moefleet bench parse: {err}", file=sys.stderr)
            code = EXIT_BAD_INPUT
            continue
        if not found:
            print(f"moefleet bench parse: {name}: no SGLang benchmark result in it; {EXPECTED}.", file=sys.stderr)
            code = EXIT_BAD_INPUT
            continue
        for result in found:
            result["file"] = name
        results.extend(found)
    if args.json:
        print(json.dumps(results, indent=2))
    elif results:
        print(table(results))
    return code
