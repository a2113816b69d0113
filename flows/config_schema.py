"""The JSON Schema of a kktlab config (issue 42), built with pydantic from the experiments' declarations
(core.declare.Param: type, default, bounds, choices, doc) and the runner's (flows/config.py RUNNER), so it
cannot drift from them: ``kktlab schema`` writes it, an editor with the YAML language server completes
and checks a config's keys with it (``# yaml-language-server: $schema=PATH`` on the config's first line),
and tests/test_config_schema.py validates every shipped config against it.

It describes what a config may hold: the top-level keys, each experiment's parameters (as ``params``,
as grid axes, or in a chain's stages), their types, bounds, choices and docs, the runner block.
kktlab's parser (flows/config.py, flows/stages.py) stays the judge of what runs: cross-field checks, a
stage against its upstream's parameters, data files, memory."""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Optional, Union

import pydantic

from core.declare import REQUIRED, Param

STRICT = pydantic.ConfigDict(extra="forbid", populate_by_name=True)
# A grid axis written as a range of integers or evenly spaced floats (flows/config_axes.py).
Range = pydantic.create_model("Range", __config__=STRICT, range=(list[int], pydantic.Field(min_length=2, max_length=3)))
Linspace = pydantic.create_model("Linspace", __config__=STRICT, linspace=(list[float], pydantic.Field(min_length=3,
                                                                                                      max_length=3)))


def _type(p: Param) -> Any:
    """The value type of a parameter: one of its choices, or its type within its bounds."""
    if p.choices is not None:
        return Literal[tuple(p.choices)]
    if p.type is int:
        return pydantic.conint(ge=p.min, gt=p.gt, le=p.limit())  # its max, else every int's (2**53)
    if p.type is float:
        return pydantic.confloat(ge=p.min, gt=p.gt, le=p.limit(), allow_inf_nan=False)
    return p.type


def _field(p: Param, name: str) -> pydantic.fields.FieldInfo:
    doc = p.doc + ("" if p.default is REQUIRED else f" (default: {json.dumps(p.default)})")
    return pydantic.Field(None, alias=name, description=doc)


def _block(title: str, params: dict[str, Param], axis: bool = False) -> type[pydantic.BaseModel]:
    """A model whose fields are ``params``, every one optional (a required parameter may be a grid
    axis instead); as grid axes (``axis``) each takes a list of values (a value or a case: the
    coordinate beside the fixed parameters it sets), a range or a linspace."""
    fields = {}
    for name, p in params.items():
        t = _type(p)
        if axis:
            t = Union[list[Union[t, dict[str, Any]]], Range, Linspace]
        fields[f"f_{name}"] = (Optional[t], _field(p, name))
    return pydantic.create_model(title, __config__=STRICT, **fields)


def _models() -> tuple[list[type], list[type], type]:
    """Per experiment a one-stage config and a chain stage; the runner block."""
    from flows import config, experiments

    runner = _block("Runner", config.RUNNER)
    singles, stages = [], []
    for name in experiments.names():
        exp = experiments.get(name)
        grid, params = _block(f"{name}_grid", exp.params, axis=True), _block(f"{name}_params", exp.params)
        doc = pydantic.Field(alias="experiment", description=exp.description)
        common = {"f_experiment": (Literal[name], doc), "f_grid": (Optional[grid], pydantic.Field(None, alias="grid")),
                  "f_params": (Optional[params], pydantic.Field(None, alias="params")),
                  "f_name": (Optional[str], pydantic.Field(None, alias="name", max_length=100))}
        singles.append(pydantic.create_model(
            f"{name}_config", __config__=STRICT, **common,
            f_description=(Optional[str], pydantic.Field(None, alias="description")),
            f_store=(Optional[str], pydantic.Field(None, alias="store")),
            f_runner=(Optional[runner], pydantic.Field(None, alias="runner"))))
        stages.append(pydantic.create_model(
            f"{name}_stage", __config__=STRICT, **common,
            f_from=(Optional[str], pydantic.Field(None, alias="from", description="the stage whose results it reads")),
            f_cases=(Optional[dict[str, Any]], pydantic.Field(None, alias="cases"))))
    return singles, stages, runner


def schema() -> dict:
    """The JSON Schema (draft 2020-12) of a kktlab config file: one experiment, or a chain of stages."""
    singles, stages, runner = _models()
    one = pydantic.Field(discriminator="f_experiment")
    stage = Union[tuple(stages)]
    chain = pydantic.create_model(
        "chain", __config__=STRICT, f_stages=(list[stage], pydantic.Field(alias="stages", min_length=1)),
        f_name=(Optional[str], pydantic.Field(None, alias="name", max_length=100)),
        f_description=(Optional[str], pydantic.Field(None, alias="description")),
        f_store=(Optional[str], pydantic.Field(None, alias="store")),
        f_runner=(Optional[runner], pydantic.Field(None, alias="runner")))
    top = Union[chain, Annotated[Union[tuple(singles)], one]]
    out = pydantic.TypeAdapter(top).json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": "kktlab config", **out}
