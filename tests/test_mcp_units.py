"""MCP tools without a server process: how results become Messages API content, argument checks against a server's
schema, names, approval. A streamable-HTTP server
runs in a thread of this process where a live session is needed (see test_mcp.py for the subprocess tests)."""

from __future__ import annotations

import importlib.util
import logging
import socket
import threading
from pathlib import Path

import pytest
from mcp import types

from looptrace.runtime import tools as toolkit
from looptrace.runtime.mcp_connections import MCPConnections
from looptrace.runtime.mcp_results import tool_result
from looptrace.runtime.mcp_servers import MCPServerHTTP, MCPServerStdio, MCPTool, tool_name

PNG = "iVBORw0KGgoAAAANSUhEUg=="


# --- results ------------------------------------------------------------------------------------------------------


def result(*content, structured=None, is_error=False):
    return types.CallToolResult(content=list(content), structured_content=structured, is_error=is_error)


def test_text_alone_is_sent_as_a_string_like_a_python_tools_result():
    assert tool_result(result(types.TextContent(text="a"), types.TextContent(text="b"))) == "a\nb"


def test_an_image_is_an_image_block_and_the_spans_see_a_placeholder():
    converted = tool_result(result(types.TextContent(text="chart"), types.ImageContent(data=PNG, mime_type="image/png")))
    assert isinstance(converted, toolkit.ContentBlocks)
    assert converted.blocks[1] == {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                                               "data": PNG}}
    assert toolkit.result_text(converted) == f"chart\n[image: image/png, {len(PNG)} characters of base64]"


def test_embedded_resources_become_text_images_or_documents():
    text = types.EmbeddedResource(resource=types.TextResourceContents(uri="file:///a.md", mime_type="text/markdown",
                                                                      text="# A"))
    pdf = types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///a.pdf", mime_type="application/pdf",
                                                                     blob="JVBERi0="))
    tiff = types.EmbeddedResource(resource=types.BlobResourceContents(uri="file:///a.tif", mime_type="image/tiff",
                                                                      blob="SUkq"))
    converted = tool_result(result(text, pdf, tiff))
    assert isinstance(converted, toolkit.ContentBlocks)
    first, document, note = converted.blocks
    assert first == {"type": "text", "text": "[resource file:///a.md (text/markdown)]\n# A"}
    assert document["type"] == "document" and document["source"]["media_type"] == "application/pdf"
    assert note["type"] == "text" and "image/tiff" in note["text"] and "not shown" in note["text"]


def test_audio_and_links_are_described_in_text():
    converted = tool_result(result(types.AudioContent(data="AAAA", mime_type="audio/wav"),
                                   types.ResourceLink(uri="https://example.com/x", name="x")))
    assert converted == ("[audio (audio/wav) not shown: the Messages API takes no audio]\n"
                         "[resource link: https://example.com/x (x)]")


def test_structured_content_is_sent_as_json_only_when_no_text_mirrors_it():
    assert tool_result(result(structured={"celsius": 21})) == '{"celsius": 21}'
    assert tool_result(result(types.TextContent(text="21 C"), structured={"celsius": 21})) == "21 C"


def test_content_blocks_hold_each_text_block_to_the_result_limit():
    blocks = toolkit.ContentBlocks([{"type": "text", "text": "x" * 50}, {"type": "image", "source": {"data": "y"}}])
    sent = blocks.message_content(10, lambda text, limit: text[:limit] + "…" if len(text) > limit else text)
    assert sent[0]["text"] == "x" * 10 + "…" and sent[1] == {"type": "image", "source": {"data": "y"}}


# --- arguments and names ------------------------------------------------------------------------------------------

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1}},
          "required": ["city"], "additionalProperties": False}


def mcp_tool(schema=SCHEMA) -> MCPTool:
    async def fn(**kwargs):
        return kwargs
    return MCPTool(name="forecast", description="d", input_schema=schema, fn=fn, server="s", remote_name="forecast")


def test_arguments_are_checked_against_the_servers_schema_without_quoting_values():
    assert mcp_tool().validate({"city": "Oslo", "days": 2}) == {"city": "Oslo", "days": 2}
    with pytest.raises(toolkit.InvalidArguments) as caught:
        mcp_tool().validate({"days": "sk-secret-value", "extra": 1})
    message = str(caught.value)
    assert "'city' is a required property" in message
    assert "days: must be of type integer" in message and "extra" in message
    assert "sk-secret-value" not in message


def test_a_schema_the_server_sent_malformed_leaves_checking_to_the_server():
    assert mcp_tool({"type": "object", "properties": {"x": {"type": 12}}}).validate({"x": 1}) == {"x": 1}


def test_names_the_messages_api_refuses_are_rewritten():
    assert tool_name("notes.search/v2") == "notes_search_v2"
    assert len(tool_name("x" * 100)) == 64


def test_a_server_is_named_after_the_script_a_launcher_runs():
    assert MCPServerStdio.parse("npx -y @modelcontextprotocol/server-filesystem /tmp").label == "server-filesystem"
    assert MCPServerStdio.parse("python -m my_server").label == "my_server"
    assert MCPServerStdio.parse("/opt/bin/notes-server --db x").label == "notes-server"
    assert MCPServerHTTP("http://127.0.0.1:9/mcp").label == "127.0.0.1"
    with pytest.raises(ValueError):
        MCPServerStdio.parse("   ")


def test_secrets_in_a_servers_env_and_headers_stay_out_of_its_repr():
    assert "sk-" not in repr(MCPServerStdio("srv", env={"API_KEY": "sk-1"}))
    assert "sk-" not in repr(MCPServerHTTP("http://127.0.0.1/mcp", headers={"Authorization": "Bearer sk-1"}))


# --- a live session, in a thread ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def in_thread_server():
    """The test server's MCPServer object on 127.0.0.1, port 0, over streamable HTTP, in a thread of this process."""
    import uvicorn

    spec = importlib.util.spec_from_file_location("mcp_test_server", Path(__file__).parent / "data" /
                                                  "mcp_test_server.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(module.server.streamable_http_app(), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}/mcp"
    finally:
        server.should_exit = True
        thread.join(30)


def test_approval_per_server_per_tool_or_by_predicate(in_thread_server):
    asked = []

    def predicate(tool, arguments):
        asked.append((tool, arguments))
        return tool == "add" and arguments.get("a", 0) > 10

    configs = [MCPServerHTTP(in_thread_server, name="all", needs_approval=True),
               MCPServerHTTP(in_thread_server, name="some", needs_approval={"add", "notes.search"}),
               MCPServerHTTP(in_thread_server, name="pred", needs_approval=predicate)]
    connections = MCPConnections(configs)
    try:
        connections.wait_ready()
        tools = connections.tools()
    finally:
        connections.close()
    assert tools["add"].needs_approval is True and tools["lookup"].needs_approval is True
    assert tools["some_add"].needs_approval is True and tools["some_notes_search"].needs_approval is True
    assert tools["some_lookup"].needs_approval is False
    assert tools["pred_add"].needs_approval({"a": 11}) is True and tools["pred_lookup"].needs_approval({}) is False
    assert asked == [("add", {"a": 11}), ("lookup", {})]


def test_name_clashes_go_to_the_first_comer_then_server_prefixed_then_left_out(in_thread_server, caplog):
    configs = [MCPServerHTTP(in_thread_server, name="one"), MCPServerHTTP(in_thread_server, name="one")]
    connections = MCPConnections(configs)
    try:
        connections.wait_ready()
        with caplog.at_level(logging.WARNING, logger="looptrace"):
            tools = connections.tools(taken={"add"})  # an @tool function named add
    finally:
        connections.close()
    assert tools["one_add"].remote_name == "add" and "add" not in tools  # the Python tool keeps its name
    assert tools["lookup"].server == "one" and tools["one_lookup"].server == "one"
    skipped = [r.message for r in caplog.records if "mcp_tool_skipped" in r.message]
    assert any("'add'" in m for m in skipped)  # the second server's add: both names taken


def test_a_call_after_the_servers_closed_is_a_tool_error(in_thread_server):
    import asyncio

    connections = MCPConnections([MCPServerHTTP(in_thread_server)])
    connections.wait_ready()
    add = connections.tools()["add"]
    connections.close()
    connections.close()  # idempotent
    with pytest.raises(toolkit.ToolError, match="closed"):
        asyncio.run(add.fn(a=1, b=2))


def test_looptrace_run_with_a_server_that_cannot_start_says_so_in_one_line_and_exits_2(workdir, api, capsys):
    from looptrace.cli.app import main

    code = main(["run", "hello", "--mcp", "/nonexistent/notes-server --db x"])
    err = capsys.readouterr().err
    assert code == 2 and api.requests == []
    assert [line for line in err.splitlines() if "notes-server" in line] == [
        "looptrace: error: MCP server 'notes-server' cannot start: FileNotFoundError: [Errno 2] No such file or "
        "directory: '/nonexistent/notes-server'"]


def test_looptrace_mcp_list_needs_a_server(capsys):
    from looptrace.cli.app import main

    assert main(["mcp", "list"]) == 2
    assert "--mcp 'COMMAND ARGS' or --mcp-url URL" in capsys.readouterr().err
