"""The fence and dispatch number of a request reach the destination as headers.

A worker paused past its lease TTL can send its dispatch after a newer worker proved the
action absent and dispatched it again. A destination that cannot dedupe by key has only
the fence to refuse the late one by, so the connector sends ``Agentium-Fence`` and
``Agentium-Dispatch`` (renamable, or ``None`` to send neither), and the test server's
``refuse_stale_fences=True`` shows the refusal.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from http_support import make_request

from agentium_graph import (
    ConfigurationError,
    ExecutionGraphProgram,
    ExecutionGraphRuntime,
    HostCatalog,
    InMemoryDurableTaskStore,
    ToolBinding,
)
from agentium_graph_http import HttpActionConnector, HttpRejectedError
from agentium_graph_http.testing import IdempotentTestServer

Connect = Callable[..., HttpActionConnector]


def _fenced(request: Any, fence: int | None, dispatch: int | None = 1) -> Any:
    return request.model_copy(update={"fence": fence, "dispatch": dispatch})


async def test_dispatch_sends_the_fence_and_dispatch_number(
        server: IdempotentTestServer, connect: Connect) -> None:
    await connect().dispatch(_fenced(make_request("act_f1"), 7, 2))
    sent = {k.lower(): v for k, v in server.last_post_headers.items()}
    assert (sent["agentium-fence"], sent["agentium-dispatch"]) == ("7", "2")


async def test_a_request_built_by_hand_sends_neither(server: IdempotentTestServer,
                                                     connect: Connect) -> None:
    await connect().dispatch(make_request("act_f2"))  # fence and dispatch are None
    sent = {k.lower() for k in server.last_post_headers}
    assert "idempotency-key" in sent
    assert not sent & {"agentium-fence", "agentium-dispatch"}


async def test_renamed_headers_and_none(server: IdempotentTestServer,
                                        connect: Connect) -> None:
    await connect(fence_header="X-Lease-Fence", dispatch_header=None).dispatch(
        _fenced(make_request("act_f3"), 3))
    sent = {k.lower(): v for k, v in server.last_post_headers.items()}
    assert sent["x-lease-fence"] == "3"
    assert not {"agentium-fence", "agentium-dispatch"} & set(sent)


@pytest.mark.parametrize(("options", "needle"), [
    ({"fence_header": "Idempotency-Key"}, "three different headers"),
    ({"dispatch_header": "agentium-fence"}, "three different headers"),
    ({"fence_header": "Bad Header"}, "fence_header"),
    ({"dispatch_header": "Content-Type"}, "dispatch_header"),
    ({"headers": {"Agentium-Fence": "1"}}, "Agentium-Fence"),
    ({"fence_header": 5}, "fence_header"),
])
def test_bad_header_options_are_refused_naming_them(options: dict[str, Any],
                                                    needle: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        HttpActionConnector("http://127.0.0.1:1", **options)
    assert needle in str(info.value)


async def test_a_fencing_destination_refuses_a_late_lower_fence() -> None:
    with IdempotentTestServer(dedupe=False, refuse_stale_fences=True) as server:
        async with server.connector(idempotent_destination=False, timeout_s=5) as connector:
            request = make_request("act_f4")
            await connector.dispatch(_fenced(request, 2, 2))      # the newer worker
            with pytest.raises(HttpRejectedError) as info:
                await connector.dispatch(_fenced(request, 1, 1))  # the paused one, late
            await connector.dispatch(_fenced(request, 3, 3))      # a newer one still goes
        assert info.value.status == 412
        assert not info.value.may_have_taken_effect
        assert "fence 1 is lower than fence 2" in str(info.value)
        # Without the refusal a non-deduping server would have accepted all three.
        assert server.accepted_for("act_f4") == 2
        assert server.stale_refused == 1


async def test_the_runtime_sends_the_task_fence_on_a_real_dispatch() -> None:
    with IdempotentTestServer() as server:
        connector = server.connector(id="payments", timeout_s=5)
        catalog = HostCatalog([ToolBinding(id="pay", version="1", connector=connector,
                                           destination=connector.destination)])
        program = ExecutionGraphProgram(id="p", version="1", plan={
            "schemaVersion": 1, "revision": 1,
            "nodes": [{"id": "pay", "binding": "pay", "version": "1",
                       "args": {"amount": 5}}]})
        store = InMemoryDurableTaskStore()
        runtime = ExecutionGraphRuntime(catalog=catalog, store=store)
        await runtime.create("k1", program)
        first = await runtime.run("k1", "w1")
        view = await runtime.inspect("k1")
        sent = {k.lower(): v for k, v in server.last_post_headers.items()}
        await connector.aclose()
    assert first.status == "completed"
    assert sent["agentium-fence"] == str(view.fence)
    assert sent["agentium-dispatch"] == "1"
    assert sent["idempotency-key"] == view.actions[0].action_id
