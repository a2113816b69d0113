"""Create the process work pool and one deployment per experiment on a Prefect server.

    PREFECT_API_URL=http://127.0.0.1:4200/api kktlab deploy --pool kktlab-pool

Each deployment runs ``kktlab/served_flow.py:submit`` from this checkout (``from_source`` on the
local folder, so workers must see the same filesystem); its parameters are the config path,
the store and top-level overrides. ``kktlab submit CONFIG`` creates a flow run of the
deployment named after the config's experiment. deploy/prefect.yaml holds the same for
``prefect deploy --all``; it is written from the experiment registry, never by hand:

    kktlab deploy --write-yaml deploy/prefect.yaml
"""

from __future__ import annotations

import asyncio
import os
import pathlib

from core.errors import UserError

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENTRYPOINT = "kktlab/served_flow.py:submit"
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


CRASH_AUTOMATION = "kktlab: mark flow runs that stop sending heartbeats Crashed"
HEARTBEATS_MISSED = 3  # a run is crashed after this many heartbeat periods without one
# ($KKTLAB_HEARTBEATS_MISSED: another whole number >= 2; the tests' crash drill uses 2)


def heartbeat_s() -> int:
    """Seconds between a flow run's heartbeats (``PREFECT_FLOWS_HEARTBEAT_FREQUENCY``; workers and
    ``kktlab deploy`` must agree: ``make worker`` and ``make deploy`` both set 30)."""
    from prefect.settings import get_current_settings

    return int(get_current_settings().flows.heartbeat_frequency or 180)


def ensure_crash_automation(within_s: int | None = None) -> tuple[str, int]:
    """Prefect's own zombie detection (docs: "detect zombie flows"): an automation that marks a
    running flow run Crashed when no heartbeat (nor a final state) follows its last heartbeat within
    ``within_s`` seconds (default :data:`HEARTBEATS_MISSED` heartbeat periods), e.g. when its worker
    process or machine died (issue 30 item 1). Made once per server; returns its id and the bound
    (seconds without a heartbeat after which a run is marked Crashed)."""
    from datetime import timedelta

    from prefect.automations import Automation
    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import EventTrigger, Posture
    from prefect.events.schemas.events import ResourceSpecification

    missed = int(os.environ.get("KKTLAB_HEARTBEATS_MISSED") or HEARTBEATS_MISSED)
    if missed < 2:  # one period is what a healthy run takes between two heartbeats: crashes would be false
        raise UserError(f"KKTLAB_HEARTBEATS_MISSED={missed}: a run must be allowed at least 2 heartbeat periods")
    within_s = within_s or missed * heartbeat_s()
    try:
        have = Automation.read(name=CRASH_AUTOMATION)
    except ValueError:  # none yet
        have = None
    if have is not None and int(have.trigger.within.total_seconds()) == within_s:
        return str(have.id), within_s
    if have is not None:
        have.delete()
    made = Automation(
        name=CRASH_AUTOMATION,
        description=f"a flow run without a heartbeat for {within_s} s is marked Crashed; rerun its command to resume",
        trigger=EventTrigger(
            after={"prefect.flow-run.heartbeat"},
            expect={"prefect.flow-run.heartbeat", "prefect.flow-run.Completed", "prefect.flow-run.Failed",
                    "prefect.flow-run.Cancelled", "prefect.flow-run.Crashed"},
            match=ResourceSpecification({"prefect.resource.id": ["prefect.flow-run.*"]}),
            for_each={"prefect.resource.id"}, posture=Posture.Proactive, threshold=1,
            within=timedelta(seconds=within_s)),
        actions=[ChangeFlowRunState(state=StateType.CRASHED,
                                    message=f"no heartbeat for {within_s} s: its worker or machine died; "
                                            "rerun the same kktlab submit (or run) command to resume the store")],
    ).create()
    return str(made.id), within_s


def deploy_all(pool: str, experiments: dict[str, str]) -> list[str]:
    """One deployment per experiment (name -> description) of ``ENTRYPOINT`` on ``pool``, applied
    in one call (Prefect prints one table of them all, not one per deployment)."""
    from prefect import deploy
    from prefect import flow as prefect_flow

    asyncio.run(ensure_pool(pool))
    remote = prefect_flow.from_source(source=str(ROOT), entrypoint=ENTRYPOINT)
    deployments = [remote.to_deployment(name=name, work_pool_name=pool, description=description,
                                        parameters={"config_path": "", "store": None})
                   for name, description in experiments.items()]
    ids = deploy(*deployments, work_pool_name=pool, print_next_steps_message=False, ignore_warnings=True)
    return [str(i) for i in ids]


def prefect_yaml(experiments: dict[str, str], pool: str = "kktlab-pool") -> str:
    """deploy/prefect.yaml: the deployments :func:`deploy_all` makes (name -> description), for
    ``prefect deploy --all``."""
    import json

    lines = [HEADER.rstrip("\n")]
    for name, description in experiments.items():
        lines += [f"  - name: {name}", f"    entrypoint: {ENTRYPOINT}", f"    description: {json.dumps(description, ensure_ascii=False)}",
                  '    parameters: {config_path: "", store: null}', f"    work_pool: {{name: {pool}}}"]
    return "\n".join(lines) + "\n"

