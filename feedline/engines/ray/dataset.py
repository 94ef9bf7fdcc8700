"""The lazy ``ray.data.Dataset`` of a plan: read tasks (or a Ray source) and fused stages.

:func:`build_dataset` turns a plan's source and its first segment of operators (up to the
first ``limit``) into ``ray.data`` stages for :class:`~feedline.engines.ray.engine.RayEngine`:
``ray.data.from_items`` of the read-task indices (one block per task; a task in shares
when there are fewer tasks than actors in the first actor stage), a read stage in Ray
tasks, then one actor stage per model or tokenizer (see :mod:`feedline.engines.ray.stages`),
each actor pool sized by the operator's ``concurrency=`` (else autoscaling from 1 to the
cluster's CPUs) and given a GPU for ``device="cuda..."`` when the cluster has one.
Relational sources go to Ray Data's own operators (:mod:`feedline.engines.ray.relational`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from feedline.engines.ray.logs import configure_context
from feedline.engines.ray.relational import relational_dataset
from feedline.engines.ray.runtime import ship_user_modules
from feedline.engines.ray.source import RaySource
from feedline.engines.ray.stages import (
    PART_COLUMN,
    PARTS_COLUMN,
    ActorStage,
    StageRunner,
    StageSpec,
    split_stages,
)
from feedline.plan.plan import Operator, Plan, Pushdown
from feedline.plan.relational import RelationalSource

if TYPE_CHECKING:
    from feedline.engines.ray.engine import RayEngine

__all__ = ["build_dataset"]


def build_dataset(
    engine: RayEngine,
    plan: Plan,
    pushed: Pushdown,
    ops: tuple[Operator, ...],
    *,
    preserve_order: bool,
    collector: Any = None,
    run_id: str = "",
    conform: pa.Schema | None = None,
    partial: Callable[[pa.RecordBatch], Any] | None = None,
    merge: Callable[[Any, Any], Any] | None = None,
    count_output: bool = False,
) -> Any:
    """The lazy ``ray.data.Dataset`` reading ``plan``'s source and running ``ops``
    (operators without a ``Limit``) on ``engine``'s Ray; ``None`` when the source has no
    read tasks. It is also the method ``RayEngine.dataset``.

    ``pushed`` is the plan's pushdown (columns and predicate the read tasks apply). The
    stages count rows and skipped records into ``collector`` under ``run_id``; the last stage
    casts to ``conform`` when given, reduces each read task's output with ``partial`` (and
    ``merge``) for ``aggregate``, and counts its output rows with ``count_output``."""
    import ray.data

    engine.ensure_ray()
    ship_user_modules(ops)
    source = plan.source
    if isinstance(source, RelationalSource):  # Ray Data's own operators
        return relational_dataset(
            engine,
            plan,
            pushed,
            ops,
            preserve_order=preserve_order,
            collector=collector,
            run_id=run_id,
            conform=conform,
            partial=partial,
            merge=merge,
            count_output=count_output,
        )
    shares = 1  # see _shares
    if isinstance(source, RaySource):
        rds = source.private_copy()
        labels: tuple[str, ...] = (source.describe(),)
        first: dict[str, Any] = {"source_blocks": (pushed.columns, pushed.predicate)}
    else:
        tasks = source.read_tasks(pushed.columns, pushed.predicate)
        if not tasks:
            return None
        labels = tuple(task.label for task in tasks)
        shares = _shares(len(tasks), ops, partial)
        items = _items(len(tasks), shares)
        rds = ray.data.from_items(items, override_num_blocks=len(items))
        first = {"read_tasks": tuple(tasks)}
    context = rds.context  # the dataset's own copy: the global context is left alone
    context.execution_options.preserve_order = preserve_order
    context.raise_original_map_exception = True
    configure_context(context)  # no progress output unless fl.config.verbosity asks
    stages = split_stages(ops)
    for number, (offset, stage_ops) in enumerate(stages):
        last = number == len(stages) - 1
        spec = StageSpec(
            ops=stage_ops,
            offset=offset,
            labels=labels,
            tag_output=not last,
            conform=conform if last else None,
            partial=partial if last else None,
            merge=merge if last else None,
            collector=collector,
            run_id=run_id,
            count_output=count_output and last,
            **(first if number == 0 else {}),
        )
        common = {"batch_format": "pyarrow", "batch_size": None, "zero_copy_batch": True}
        if number == 0:
            rds = rds.map_batches(StageRunner(spec), **common)
        else:
            shared = number == 1 and shares > 1
            rds = rds.map_batches(
                ActorStage,
                fn_constructor_args=(spec,),
                compute=_actor_pool(stage_ops[0], shared),
                **_gpus(stage_ops[0]),
                **common,
            )
    return rds


def _pool_size(op: Operator) -> tuple[int, int]:
    """``(min, max)`` actors of an actor stage: ``concurrency`` when the operator gives it,
    else 1 to the cluster's CPUs."""
    concurrency = getattr(op, "concurrency", None)
    if concurrency:
        return concurrency, concurrency
    import ray

    return 1, max(1, int(ray.cluster_resources().get("CPU", 1)))


def _actor_pool(op: Operator, shared: bool = False) -> Any:
    """Ray's ``ActorPoolStrategy`` for an actor stage (:func:`_pool_size`; Ray's current
    API: ``map_batches(concurrency=)`` is deprecated since Ray 2.51). With shared read
    tasks, one input at a time per actor: the first actor to start must not take the
    shares meant for the others."""
    from ray.data import ActorPoolStrategy

    low, high = _pool_size(op)
    in_flight = 1 if shared else None
    if low == high:
        return ActorPoolStrategy(size=high, max_tasks_in_flight_per_actor=in_flight)
    return ActorPoolStrategy(min_size=low, max_size=high, max_tasks_in_flight_per_actor=in_flight)


def _shares(tasks: int, ops: tuple[Operator, ...], partial: Any) -> int:
    """In how many shares each read task is read: more than one when the first actor stage
    asks for more actors (``concurrency=``) than there are read tasks (one shard would
    otherwise feed one actor while the others wait: Ray hands an actor whole inputs, and
    runs the reads in the actors). Each share reads the whole task again (see
    :meth:`~feedline.engines.ray.stages.StageRunner._share`): worth it where the model is
    the cost. Never for an autoscaling pool or an aggregate's partials (one per task)."""
    stages = split_stages(ops)
    if partial is not None or len(stages) < 2 or tasks == 0:
        return 1
    actors = getattr(stages[1][1][0], "concurrency", None) or 1
    return -(-actors // tasks) if tasks < actors else 1


def _items(tasks: int, shares: int) -> list[dict[str, int]]:
    """The read stage's input items: one per read task, or per share of one (see
    :meth:`feedline.engines.ray.stages.StageRunner._share`)."""
    if shares == 1:
        return [{"task": i} for i in range(tasks)]
    return [
        {"task": i, PART_COLUMN: j, PARTS_COLUMN: shares}
        for i in range(tasks)
        for j in range(shares)
    ]


def _gpus(op: Operator) -> dict[str, Any]:
    """``num_gpus=1`` per actor for a model asking for ``device="cuda..."`` when the
    cluster has GPUs; without any, the actor starts and reports the missing device
    (:func:`feedline.plan.inference.check_device`) instead of waiting for one forever."""
    device = getattr(op, "device", None)
    if not device or not device.startswith("cuda"):
        return {}
    import ray

    return {"num_gpus": 1} if ray.cluster_resources().get("GPU", 0) >= 1 else {}
