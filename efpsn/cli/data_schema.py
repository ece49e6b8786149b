"""`efpsn data schema`: the public table schema of .csv tables (the label column and its class
names, every feature column, number or category, the dropped columns), written as the JSON file
a coordinator takes with --table-schema; every problem of every file said at once.

On one machine `efpsn up --data-dir D` makes this schema by itself. On separate hosts no process
sees every party's table: the schema is made from public files (the public test.csv, a sample)
with schema.json's lists ("classes", "categories", "drop"), or from a party's own table, whose
class names and categories then become public.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["register"]


def _schema(args: argparse.Namespace) -> int:
    from efpsn.data.folders import DataDirSchema, read_data_schema
    from efpsn.data.inspection import inspect_folder, inspect_tables
    from efpsn.data.tables import DataProblems
    from efpsn.params.schema import TaskSpec

    drop = [c.strip() for text in args.drop for c in text.split(",") if c.strip()]
    given = {"task": args.task} if args.task else {}
    if args.data_dir:
        if args.data or args.schema:
            raise ValueError("--data-dir reads the folder's own files and schema.json: give "
                             "it alone, or --data FILE (and --schema FILE) without it")
        table = inspect_folder(args.data_dir, label_column=args.label_column, drop=drop,
                               given=given).table
        if not table.given:
            raise ValueError(f"--data-dir {args.data_dir} holds .npz files, which have no "
                             "table schema (their X and y are numbers already)")
    else:
        if not args.data:
            raise ValueError("give the tables: --data FILE (repeatable) or --data-dir DIR")
        listed = read_data_schema(args.schema) if args.schema else DataDirSchema()
        column = args.label_column or listed.label_column or "label"
        found = inspect_tables({Path(p).name: Path(p) for p in args.data}, label_column=column,
                               drop=(*listed.drop, *drop),
                               regression=TaskSpec.of(args.task or "logreg").regression,
                               class_names=listed.class_names,
                               categories=listed.listed_categories(),
                               classes_given=listed.classes is not None)
        if found.problems:
            raise DataProblems(", ".join(args.data), found.problems)
        assert found.schema is not None
        table = found.schema
    out = Path(args.out)
    out.write_text(json.dumps(table.to_json(), indent=2) + "\n")
    print(f"wrote {out}: {table.describe()}" + (f"; dropped {', '.join(table.drop)}"
                                                  if table.drop else ""))
    disclosure = table.disclosure()
    print("public (give it to the coordinator: --table-schema " + str(out) + "); "
          + (disclosure.replace("disclosed by design to every party and the coordinator (the "
                                "table schema, a run parameter): ", "it names ")
             if disclosure else "its sets are the listed ones, nothing learnt from a table"))
    return 0


def register(data_sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add `efpsn data schema` to `efpsn data`'s subcommands."""
    schema = data_sub.add_parser(
        "schema", help="the public table schema of .csv tables, for a coordinator's "
                       "--table-schema",
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="examples:\n  efpsn data schema --data D/test.csv --schema D/schema.json "
               "--label-column species --out table.json\n  efpsn data schema --data-dir D "
               "--label-column species --out table.json",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    schema.add_argument("--data", action="append", default=[], metavar="FILE",
                        help="a .csv table to read (repeatable): public ones, or your own")
    schema.add_argument("--data-dir", default=None, metavar="DIR",
                        help="a data folder's every table, as efpsn up reads them")
    schema.add_argument("--schema", default=None, metavar="schema.json",
                        help="the lists that are public, not learnt from the tables: "
                             "\"classes\": [...], \"categories\": {...}, \"drop\": [...]")
    schema.add_argument("--label-column", default=None,
                        help="the label column (default: schema.json's, else label)")
    schema.add_argument("--drop", action="append", default=[], metavar="COLUMN[,COLUMN...]",
                        help="columns that are not features; repeatable")
    schema.add_argument("--task", default=None,
                        help="ridge for a numeric target (the label column holds numbers)")
    schema.add_argument("--out", required=True, metavar="FILE", help="the JSON file to write")
    schema.set_defaults(handler=_schema, numeric=False)
    return schema
