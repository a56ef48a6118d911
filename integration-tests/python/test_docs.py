"""Runs every ```sql and ```python block of docs/querying.md against a dataset.

    python test_docs.py --docs docs/querying.md --dataset DIR --dataset-int8 DIR --query FILE

The placeholders the document explains at its top are replaced: 'out/' by
the dataset, 'out-int8/' by the same dataset compacted with `--embedding-type
int8` (--dataset-int8), `[768]` by the dataset's embedding dimension, the example chip id
by a chip of the dataset. The blocks run in a scratch directory holding the
query vector as q.json, section by section (`## ` headings): SQL blocks on one
DuckDB connection per section, Python blocks in one namespace per section, in
the order a reader copies them. Each block must run and give rows: the SQL
block's last statement, the Python block's last expression. Every reader
section must have the four kinds of query. tests/readers.rs runs it.
"""

import argparse
import ast
import glob
import os
import re
import shutil
import sys
import tempfile
import traceback

import duckdb
import pyarrow.parquet as pq

CHIP_PLACEHOLDER = "0123456789abcdef0123456789abcdef"
DIM_PLACEHOLDER = "768"
READERS = ["DuckDB", "Polars", "PyArrow", "GeoPandas"]
# Subsection heading words for the four queries every reader section shows.
KINDS = {"text": "nearest neighbours of a text", "chip": "nearest neighbours of a chip",
         "box": "bounding box", "source": "back to the sources"}


def blocks(path):
    """[(section, subsection, lang, code, line)] of the runnable fenced blocks."""
    out, section, sub, lang, code, start = [], "", "", None, [], 0
    with open(path) as f:
        for n, line in enumerate(f, 1):
            if lang is None:
                if line.startswith("## "):
                    section, sub = line[3:].strip(), ""
                elif line.startswith("### "):
                    sub = line[4:].strip()
                m = re.match(r"^```(\w*)\s*$", line)
                if m:
                    lang, code, start = m.group(1), [], n
            elif line.rstrip() == "```":
                if lang in ("sql", "python"):
                    out.append((section, sub, lang, "".join(code), start))
                lang = None
            else:
                code.append(line)
    assert lang is None, f"unclosed code block at line {start}"
    return out


def substitute(code, dataset, dim, chip, int8=None):
    if int8 is not None:
        code = re.sub(r"""(['"])out-int8/""", lambda m: f"{m.group(1)}{int8}/", code)
    code = re.sub(r"""(['"])out/""", lambda m: f"{m.group(1)}{dataset}/", code)
    code = code.replace(f"[{DIM_PLACEHOLDER}]", f"[{dim}]")
    return code.replace(CHIP_PLACEHOLDER, chip)


def count(value):
    """Rows of a block's result, for whatever the reader returned."""
    if value is None:
        return 0
    for attr in ("num_rows", "height"):
        if isinstance(getattr(value, attr, None), int):
            return getattr(value, attr)
    return len(value)


def run_python(code, ns):
    tree = ast.parse(code)
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, "<block>", "exec"), ns)  # noqa: S102 - the documented code
    assert last is not None, "the block must end with the expression it shows"
    return eval(compile(ast.Expression(last.value), "<block>", "eval"), ns)  # noqa: S307


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for a in ("--docs", "--dataset", "--query"):
        ap.add_argument(a, required=True)
    ap.add_argument("--dataset-int8", required=True,
                    help="the dataset compacted with --embedding-type int8 ('out-int8/' in the docs)")
    args = ap.parse_args()
    docs = os.path.abspath(args.docs)
    dataset = os.path.abspath(args.dataset)
    files = sorted(glob.glob(os.path.join(dataset, "chips", "*.parquet")))
    dim = pq.read_schema(files[0]).field("embedding").type.list_size
    (chip,) = duckdb.connect().execute(
        "SELECT min(chip_id) FROM read_parquet(?) WHERE geometry IS NOT NULL",
        [os.path.join(dataset, "chips", "*.parquet")],
    ).fetchone()
    found = blocks(docs)
    print(f"{len(found)} blocks in {docs}; dataset {dataset}, D={dim}, chip {chip}")

    # Coverage: each reader section shows the four queries.
    missing = []
    for reader in READERS:
        subs = {s.lower() for sec, s, _, _, _ in found if sec == reader}
        missing += [f"{reader}: {kind}" for kind in KINDS.values() if not any(kind in s for s in subs)]

    work = tempfile.mkdtemp(prefix="rsembed-docs-")
    shutil.copy(args.query, os.path.join(work, "q.json"))
    os.chdir(work)
    ivf_sections = {sec for sec, _, _, code, _ in found if "centroids.parquet" in code}
    failed, section, con, ns = [], None, None, None
    for sec, sub, lang, code, line in found:
        if sec != section:
            section, con, ns = sec, duckdb.connect(), {"__name__": "__docs__"}
        name = f"{docs}:{line} [{sec} / {sub or '-'}] {lang}"
        if sec in ivf_sections and not os.path.exists(os.path.join(dataset, "centroids.parquet")):
            # The IVF section needs a dataset compacted with --lists: tests/ivf.rs runs it.
            print(f"skip {name}: the dataset has no centroids.parquet")
            continue
        code = substitute(code, dataset, dim, chip, os.path.abspath(args.dataset_int8))
        try:
            if lang == "sql":
                rel = con.sql(code)
                assert rel is not None, "the block's last statement must be a query"
                # Through Arrow: DuckDB's Python rows of a TIMESTAMPTZ need pytz.
                value = rel.arrow().read_all()
                shown = value.slice(0, 3).to_pylist()
            else:
                value = run_python(code, ns)
                shown = repr(value)[:300]
            rows = count(value)
            assert rows > 0, f"no rows: {shown!r}"
            print(f"ok   {name}: {rows} rows\n     {str(shown)[:300]}")
        except Exception:  # noqa: BLE001 - every block runs and reports
            failed.append(name)
            print(f"FAIL {name}\n{code}\n{traceback.format_exc()}")
    shutil.rmtree(work, ignore_errors=True)
    for m in missing:
        print(f"FAIL missing section: {m}")
    print(f"{len(found) - len(failed)} blocks ran, {len(failed)} failed, {len(missing)} sections missing")
    sys.exit(1 if failed or missing else 0)


if __name__ == "__main__":
    main()
