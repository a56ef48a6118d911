"""Bytes per chip by column of a finished job's chip files (issue 16, item 2).

Usage, from the repository root:

    .cache/venv/bin/python bench/bytes_per_chip.py OUTPUT_DIR

Sums Parquet's compressed and uncompressed column-chunk sizes over `OUTPUT_DIR/chips/*.parquet`
(DuckDB's parquet_metadata) and divides by the row count, largest column first.
"""

import sys

import duckdb


def main():
    out = sys.argv[1].rstrip("/")
    con = duckdb.connect()
    glob = f"{out}/chips/*.parquet"
    n = con.execute(f"SELECT count(*) FROM read_parquet('{glob}', union_by_name = true)").fetchone()[0]
    rows = con.execute(
        f"SELECT path_in_schema, sum(total_compressed_size), sum(total_uncompressed_size) "
        f"FROM parquet_metadata('{glob}') GROUP BY 1 ORDER BY 2 DESC"
    ).fetchall()
    print(f"{n} chips in {glob}")
    print("| column | compressed B/chip | uncompressed B/chip |")
    print("| --- | ---: | ---: |")
    total = 0.0
    for col, comp, raw in rows:
        total += comp / n
        print(f"| {col} | {comp / n:.1f} | {raw / n:.1f} |")
    emb = sum(c for col, c, _ in rows if col.startswith("embedding")) / n
    print(f"| all | {total:.1f} | |")
    print(f"non-embedding columns: {total - emb:.1f} B/chip")


if __name__ == "__main__":
    main()
