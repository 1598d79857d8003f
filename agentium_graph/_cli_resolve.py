"""``agentium-graph resolve``: record an operator's resolution of an uncertain effect."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import click

from agentium_graph.connectors import Absent, ActionOutcome
from agentium_graph.runtime._args import MAX_ACTOR_CHARS, check_key
from agentium_graph.runtime._resolve import resolve_action
from agentium_graph.store._protocol import DurableTaskStore
from agentium_graph.store._records import ActionRecord


@click.command("resolve", short_help="Resolve an uncertain effect (action).")
@click.argument("key")
@click.argument("action_id")
@click.option("--absent", is_flag=True,
              help="Attest the effect never happened: the next run dispatches it again.")
@click.option("--output", "output_json", metavar="JSON", default=None,
              help="Attest the effect happened with this JSON output: an effect node completes "
                   "with it; an agent's tool call gets it as its receipt and the agent resumes "
                   "on the next run.")
@click.option("--result-ref", default=None,
              help="The destination's reference for the outcome (default: the action id).")
@click.option("--actor", required=True, help="Who attests the resolution (journaled).")
@click.option("--json", "as_json", is_flag=True, help="Print the resolved action as JSON.")
@click.pass_obj
def resolve_command(config: object, key: str, action_id: str, absent: bool,
                    output_json: str | None, result_ref: str | None, actor: str,
                    as_json: bool) -> None:
    """Record what happened to ACTION_ID of task KEY after checking the destination.

    Exactly one of --absent or --output is required. A second, different resolution of the
    same action is rejected.
    """
    from agentium_graph.cli import CliConfig, require_text, run_with_store

    require_text(KEY=key, ACTION_ID=action_id, **{"--actor": actor, "--output": output_json,
                                                  "--result-ref": result_ref})
    check_key(key)
    if not actor.strip():
        raise click.BadParameter("must name who attests the resolution, not be blank",
                                 param_hint="'--actor'")
    if len(actor) > MAX_ACTOR_CHARS:
        raise click.BadParameter(f"is {len(actor):,} characters, more than the "
                                 f"{MAX_ACTOR_CHARS} accepted; pass a short operator name",
                                 param_hint="'--actor'")
    if absent == (output_json is not None):
        raise click.UsageError("give exactly one of --absent or --output JSON")
    verdict: ActionOutcome | Absent
    if absent:
        verdict = Absent()
    else:
        assert output_json is not None
        try:
            value = json.loads(output_json)
        except json.JSONDecodeError as exc:
            raise click.BadParameter(f"not JSON: {exc}", param_hint="'--output'") from None
        except RecursionError:  # arrays or objects nested about a thousand deep
            raise click.BadParameter("nested too deeply to be read; pass the destination's "
                                     "output as it was returned", param_hint="'--output'"
                                     ) from None
        verdict = ActionOutcome(output=value, result_ref=result_ref or action_id)
    assert isinstance(config, CliConfig)

    async def apply(store: DurableTaskStore) -> ActionRecord:
        await resolve_action(store, key, action_id, verdict, actor=actor,
                             clock=lambda: datetime.now(UTC))
        snapshot = await store.get_task(key)
        assert snapshot is not None
        return snapshot.actions[action_id]

    action = run_with_store(config, apply)
    if as_json:
        click.echo(json.dumps(action.model_dump(mode="json"), sort_keys=True, indent=2))
    else:
        # The resolution recorded: a repeated one changes nothing, so it names its first actor.
        recorded = (action.resolution or {}).get("actor", actor)
        click.echo(f"action {action_id} of task {key!r} is now {action.state} "
                   f"(resolved by {recorded!r}); run the task again to continue")
