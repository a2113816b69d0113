"""Reading a config file's YAML safely (flows/config.py validates what it holds): size, UTF-8, a key
given twice, nesting depth and alias expansion are refused in time linear in the file, one line
naming the file (issue 29 item 8: a 700-byte alias bomb no longer hangs `kktlab run`)."""

from __future__ import annotations

import pathlib
from typing import Any

import yaml

from core.errors import ConfigError

MAX_YAML_NODES = 1_000_000
MAX_YAML_DEPTH = 64  # nesting of mappings and lists (a config nests 4 deep; PyYAML composes recursively)


def read_yaml(path: pathlib.Path) -> tuple[Any, str]:
    """The YAML document of a config file and its text; refuses a missing, oversized, binary or
    invalid file, a key given twice in one mapping (YAML would silently keep the last), nesting
    deeper than MAX_YAML_DEPTH, and aliases that repeat a node into more than MAX_YAML_NODES nodes
    or into itself; each in time linear in the file."""
    from flows.config import MAX_CONFIG_BYTES, _show

    if not path.is_file():
        raise ConfigError("<file>", f"no config file at {path}")
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ConfigError("<file>", f"{path} is {size:,} bytes; a config is at most {MAX_CONFIG_BYTES:,} bytes "
                          "(grid values are listed, cells are not)")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError("<file>", f"{path} is not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
                          f"{err.start}); a config is a YAML file") from None
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if node is not None:
                _expanded_size(node, path)
                _no_duplicate_keys(node, "", set())
            raw = loader.construct_document(node) if node is not None else None
        finally:
            loader.dispose()
    except yaml.YAMLError as err:
        raise ConfigError("<file>", f"{path} is not valid YAML: {' '.join(str(err).split())}") from None
    except _TooDeep as err:
        raise ConfigError("<file>", f"{path} nests lists and mappings more than {MAX_YAML_DEPTH} deep (line "
                          f"{err.args[0]}); a config nests a few levels") from None
    except ValueError as err:  # an int literal beyond Python's digit limit, and the like
        raise ConfigError("<file>", f"{path} holds a value YAML cannot read: {_show(str(err))}") from None
    return raw, text


class _TooDeep(Exception):
    """Nesting beyond MAX_YAML_DEPTH, at this line."""


class _Loader(yaml.SafeLoader):
    """PyYAML's SafeLoader, refusing nesting deeper than MAX_YAML_DEPTH while it composes (its
    composer recurses once per level: 20,000 brackets would end in a RecursionError)."""

    _depth = 0

    def compose_node(self, parent, index):
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise _TooDeep(self.peek_event().start_mark.line + 1)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [n for pair in node.value for n in pair]
    return []


def _expanded_size(root: yaml.Node, path: pathlib.Path) -> int:
    """How many nodes the document holds once every alias is written out, counted over the node
    graph (an alias is the node it names: shared, not copied) with each node's size computed once;
    refuses a total beyond MAX_YAML_NODES and an alias inside the node it names (a cycle)."""
    size: dict[int, int] = {}
    open_: set[int] = set()  # entered, not yet sized: the path from the root
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, leaving = stack.pop()
        key = id(node)
        if leaving:
            open_.discard(key)
            size[key] = 1 + sum(size[id(c)] for c in _children(node))
            if size[key] > MAX_YAML_NODES:
                raise ConfigError("<file>", f"{path}: YAML aliases (*name) expand the node at line "
                                  f"{node.start_mark.line + 1} to more than {MAX_YAML_NODES:,} nodes; a config "
                                  "lists its values (aliases may repeat a few of them)")
            continue
        if key in size:
            continue
        if key in open_:
            raise ConfigError("<file>", f"{path}: the node at line {node.start_mark.line + 1} holds an alias of "
                              "itself (a recursive alias); write the values out")
        open_.add(key)
        stack.append((node, True))
        stack.extend((c, False) for c in _children(node) if id(c) not in size)
    return size[id(root)]


def _no_duplicate_keys(node: yaml.Node, path: str, seen_nodes: set[int]) -> None:
    """Each mapping node once (an alias repeats a node: checked where first met)."""
    if id(node) in seen_nodes:
        return
    seen_nodes.add(id(node))
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            name = str(key.value) if isinstance(key, yaml.ScalarNode) else "<key>"
            field = f"{path}.{name}" if path else name
            line = key.start_mark.line + 1
            if name in seen and name != "<<":
                raise ConfigError(field, f"given twice (lines {seen[name]} and {line}); give each key once")
            seen[name] = line
            _no_duplicate_keys(value, field, seen_nodes)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _no_duplicate_keys(item, f"{path}[{i}]", seen_nodes)
