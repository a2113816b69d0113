"""Create the process work pool and one deployment per experiment on a Prefect server.

    PREFECT_API_URL=http://127.0.0.1:4200/api kktlab deploy --pool kktlab-pool

Each deployment runs ``flows/served.py:submit`` from this checkout (``from_source`` on the
local folder, so workers must see the same filesystem); its parameters are the config path,
the store and top-level overrides. ``kktlab submit CONFIG`` creates a flow run of the
deployment named after the config's experiment. deploy/prefect.yaml holds the same for
``prefect deploy --all``; it is written from the experiment registry, never by hand:

    kktlab deploy --write-yaml deploy/prefect.yaml
"""

from __future__ import annotations

import asyncio
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENTRYPOINT = "flows/served.py:submit"
HEADER = """\
# Prefect deployments for a served kktlab (same as `kktlab deploy`); written by
#   kktlab deploy --write-yaml deploy/prefect.yaml   (tests/test_config.py checks it is current)
# Use:
#   prefect work-pool create kktlab-pool --type process
#   prefect --no-prompt deploy --all --prefect-file deploy/prefect.yaml   (run from the repo root)
# then `kktlab submit CONFIG.yaml` (or `prefect deployment run kktlab-submit/nonrobust
#   --param config_path=/abs/configs/x.yaml`) and watch the run in the UI.
name: kktlab
prefect-version: 3.8.8
pull:
  - prefect.deployments.steps.set_working_directory:
      directory: "{{ $KKTLAB_ROOT }}"
deployments:  # one per experiment
"""


async def ensure_pool(name: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists

    async with get_client() as client:
        try:
            await client.create_work_pool(WorkPoolCreate(name=name, type="process"))
        except ObjectAlreadyExists:
            pass


def deploy_all(pool: str, experiments: dict[str, str]) -> list[str]:
    """One deployment per experiment (name -> description) of ``ENTRYPOINT`` on ``pool``."""
    from prefect import flow as prefect_flow

    asyncio.run(ensure_pool(pool))
    ids = []
    for name, description in experiments.items():
        remote = prefect_flow.from_source(source=str(ROOT), entrypoint=ENTRYPOINT)
        dep_id = remote.deploy(name=name, work_pool_name=pool, parameters={"config_path": "", "store": None},
                               description=description, print_next_steps=False, ignore_warnings=True)
        ids.append(str(dep_id))
    return ids


def prefect_yaml(experiments: dict[str, str], pool: str = "kktlab-pool") -> str:
    """deploy/prefect.yaml: the deployments :func:`deploy_all` makes (name -> description), for
    ``prefect deploy --all``."""
    import json

    lines = [HEADER.rstrip("\n")]
    for name, description in experiments.items():
        lines += [f"  - name: {name}", f"    entrypoint: {ENTRYPOINT}", f"    description: {json.dumps(description, ensure_ascii=False)}",
                  '    parameters: {config_path: "", store: null}', f"    work_pool: {{name: {pool}}}"]
    return "\n".join(lines) + "\n"

