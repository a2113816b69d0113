"""``kktlab table STORE [GROUP]``: one table of a group's usable cells, grouped and aggregated,
every row printed or written (storage/table.py holds the query; this module the command)."""

from __future__ import annotations

import sys

FORMATS = ("text", "csv", "markdown", "json", "parquet")


def add_parser(sub) -> None:
    """The ``table`` subcommand (storage.table is imported when it runs, not here: pandas and Dask
    cost every other command ~3 s of start-up; an unknown --stat is refused there, naming it)."""
    s = sub.add_parser("table", help="a group's usable cells as one table: selected, grouped, aggregated, every row")
    s.add_argument("store")
    s.add_argument("group", nargs="?", help="the group (stage); may be left out when the store holds one")
    s.add_argument("--vars", help="comma-separated scalar variables (default: every numeric one)")
    s.add_argument("--by", help="comma-separated grid dims or variables to group on")
    s.add_argument("--over", help="comma-separated grid dims to aggregate over (default: seed, where it is a dim); "
                                  "a grid dim in neither --by nor --over is kept as a column")
    s.add_argument("--stat", default="mean", help="mean, median, std, sem, min, max or count (over nets, each net "
                                                  "first averaged over the other --over dims)")
    s.add_argument("--interval", default="t", choices=("t", "bca"),
                   help="the interval beside a mean: Student's t (default) or bootstrap BCa (storage/stats.py)")
    s.add_argument("--where", action="append", help="name=value or name=v1,v2 on a grid dim or variable (repeatable)")
    s.add_argument("--format", default="text", choices=FORMATS)
    s.add_argument("--out", help="write to this file (required for parquet)")
    s.set_defaults(fn=cmd_table)


def cmd_table(args) -> int:
    """Prints (or writes) the table, then one line on stderr naming the interval and what was left
    out. Damaged cells (those `kktlab verify` names) are left out of every row and counted in its
    ``excluded`` column; the command then says how many and exits 1, as `kktlab verify` does, so a
    script never takes a table with damaged cells left out for a sound one."""
    from storage.table import table, write

    df = table(args.store, args.group, vars=args.vars or (), by=args.by or (), over=args.over, stat=args.stat,
               where=args.where, interval=args.interval)
    text = write(df, args.format, args.out)
    if text is None:
        print(f"{len(df)} rows -> {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    averaged = ", ".join(df.attrs.get("averaged", [])) or "nothing"
    print(f"{args.stat} over {averaged} (per net first, then over nets), interval: {df.attrs.get('interval')}; "
          f"{int(df['excluded'].sum()) if 'excluded' in df else 0} cells excluded as not usable", file=sys.stderr)
    damaged = df.attrs.get("damaged", 0)
    if damaged:
        print(f"kktlab: {damaged} damaged cells left out of the table (`kktlab verify {args.store}` names them, "
              "`kktlab run` on the config recomputes them)", file=sys.stderr)
        return 1
    return 0


def summary_vars(ds) -> tuple:
    """The group's summary variables: its attribute, or (a store made before it) its experiment's."""
    from storage.schema import SUMMARY

    if SUMMARY in ds.attrs:
        return tuple(ds.attrs[SUMMARY])
    from flows import experiments

    name = ds.attrs.get("kktlab_experiment")
    return experiments.get(name).summary if name in experiments.names() else ()
