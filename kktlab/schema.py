"""``kktlab schema``: the JSON Schema of configs (flows/config_schema.py), for editors and validators."""

from __future__ import annotations

import json
import pathlib
import sys


def add_parser(sub) -> None:
    s = sub.add_parser("schema", help="the JSON Schema of config files (editors complete and check keys with it)")
    s.add_argument("--out", help="write it to this file (default: print it)")
    s.set_defaults(fn=cmd_schema)


def cmd_schema(args) -> int:
    from flows.config_schema import schema

    text = json.dumps(schema(), indent=1) + "\n"
    if args.out:
        pathlib.Path(args.out).write_text(text)
        print(f"wrote {args.out}; a config's first line '# yaml-language-server: $schema={args.out}' lets an "
              "editor with the YAML language server complete and check its keys", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
