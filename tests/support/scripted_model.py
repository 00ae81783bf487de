"""A scripted model behind the Anthropic Messages API, for driving the real Claude Code CLI.

The CLI is the real one (npm, pinned); only the model is scripted. Each conversation that
offers the scripted tool gets the script's tool calls one after another, one per turn, then a
closing text; anything else the CLI asks (titles, summaries) gets a short text. Every request
is kept, so a test can read exactly what the model was told after each call.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

_SCRIPTED = "toolu_scripted_"


@dataclass
class ToolCall:
    """One scripted turn: call the tool whose name ends with ``tool`` with ``arguments``."""

    tool: str
    arguments: dict[str, Any]


@dataclass
class ScriptedModel:
    script: list[ToolCall]
    closing: str = "Done."
    requests: list[dict[str, Any]] = field(default_factory=list)

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        """The content block for one request of the CLI.

        A tool the CLI defers (listed by name only, loaded through its ToolSearch tool) is
        loaded first with ``select:<name>``, as a model does.
        """
        offered = [tool.get("name", "") for tool in body.get("tools", [])]
        results = tool_results(body)
        turn = sum(1 for result in results if result["tool_use_id"].startswith(_SCRIPTED))
        if turn >= len(self.script):
            return {"type": "text", "text": self.closing}
        call = self.script[turn]
        names = [name for name in offered if name.endswith(call.tool)]
        if names:
            return {
                "type": "tool_use",
                "id": f"{_SCRIPTED}{turn}",
                "name": names[0],
                "input": call.arguments,
            }
        text = json.dumps(body).replace("\\n", " ")
        deferred = re.findall(rf"[\w-]*{re.escape(call.tool)}\b", text)
        searches = tool_calls(body, "ToolSearch")
        searched = " ".join(call["input"].get("query", "") for call in searches)
        if deferred and "ToolSearch" in offered and deferred[0] not in searched:
            return {
                "type": "tool_use",
                "id": f"toolu_search_{len(results)}",
                "name": "ToolSearch",
                "input": {"query": f"select:{deferred[0]}"},
            }
        return {"type": "text", "text": f"The tool {call.tool} is not offered."}

    def tool_results(self) -> list[dict[str, Any]]:
        """Every tool result the CLI sent back, in order (the newest request holds them all)."""
        conversations = [body for body in self.requests if body.get("tools")]
        if not conversations:
            return []
        return [
            result
            for result in tool_results(conversations[-1])
            if result["tool_use_id"].startswith(_SCRIPTED)
        ]


def tool_results(body: dict[str, Any]) -> list[dict[str, Any]]:
    results = []
    for message in body.get("messages", []):
        content = message.get("content")
        if isinstance(content, list):
            results += [block for block in content if block.get("type") == "tool_result"]
    return results


def tool_calls(body: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The calls of tool ``name`` the model made so far in this conversation."""
    calls = []
    for message in body.get("messages", []):
        content = message.get("content")
        if message.get("role") == "assistant" and isinstance(content, list):
            calls += [b for b in content if b.get("type") == "tool_use" and b.get("name") == name]
    return calls


def result_text(result: dict[str, Any]) -> str:
    content = result.get("content")
    if isinstance(content, str):
        return content
    return "\n".join(block.get("text", "") for block in content or [] if isinstance(block, dict))


def _events(body: dict[str, Any], block: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    stop = "tool_use" if block["type"] == "tool_use" else "end_turn"
    message = {
        "id": "msg_scripted",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "scripted"),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }
    yield "message_start", {"type": "message_start", "message": message}
    if block["type"] == "text":
        start = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": block["text"]}
    else:
        start = {**block, "input": {}}
        delta = {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
    yield "content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}
    yield "content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop, "stop_sequence": None},
            "usage": {"output_tokens": 1},
        },
    )
    yield "message_stop", {"type": "message_stop"}


class _Handler(BaseHTTPRequestHandler):
    model: ScriptedModel

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if "count_tokens" in self.path:
            self._json({"input_tokens": 1})
            return
        self.model.requests.append(body)
        block = self.model.answer(body)
        if not body.get("stream"):
            events = dict(_events(body, block))
            message = {**events["message_start"]["message"], "content": [block]}
            message["stop_reason"] = events["message_delta"]["delta"]["stop_reason"]
            self._json(message)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for name, data in _events(body, block):
            self.wfile.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())

    def _json(self, payload: dict[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


class ModelServer:
    """``model`` served on a free loopback port; ``url`` is the CLI's ANTHROPIC_BASE_URL."""

    def __init__(self, model: ScriptedModel) -> None:
        handler = type("Handler", (_Handler,), {"model": model})
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ModelServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
