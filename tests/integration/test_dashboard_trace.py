"""The dashboard's job page links a job to its trace through `tracing.trace_url` (issue 36), escaped, and
shows the bare traceparent without one."""

from __future__ import annotations

from jobcar.config_types import TracingSettings
from tests.integration.test_dashboard import running_ui
from tests.servers import RedisServer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"


async def test_a_job_page_links_its_trace_with_the_configured_template(
    redis_server: RedisServer, namespace: str
) -> None:
    tracing = TracingSettings(trace_url="http://jaeger.internal:16686/trace/{trace_id}?uiFind=a&b")
    async with running_ui(redis_server.url, namespace, token=None, write=False, tracing=tracing) as ui:
        info = await ui.client.enqueue("t.x", {}, traceparent=TRACEPARENT)
        page = await ui.get(f"/ui/job?queue=default&id={info.id}")
        assert page.status == 200
        assert f'href="http://jaeger.internal:16686/trace/{TRACE_ID}?uiFind=a&amp;b"' in page.text
        assert TRACEPARENT in page.text


async def test_without_a_template_the_traceparent_is_shown_unlinked(redis_server: RedisServer, namespace: str) -> None:
    async with running_ui(redis_server.url, namespace, token=None, write=False) as ui:
        info = await ui.client.enqueue("t.x", {}, traceparent=TRACEPARENT)
        page = await ui.get(f"/ui/job?queue=default&id={info.id}")
        assert page.status == 200
        assert TRACEPARENT in page.text
        assert "/trace/" not in page.text
