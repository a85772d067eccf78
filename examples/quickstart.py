"""Quickstart: run the deterministic `script` driver end to end.

    python examples/quickstart.py

The script driver needs no agent CLI and no network, so this runs anywhere; swap in
`adaptor.drivers.claude.Driver(...)` to run Claude Code the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import adaptor
from adaptor.drivers import script


@dataclass
class Review:
    verdict: str
    issues: int


def main() -> None:
    driver = script.Driver(
        script.Config(
            steps=(
                {"thinking": "Reading the diff"},
                {"tool_call": {"name": "Bash", "args": {"cmd": "pytest -q"}, "result": {"exit": 0}}},
                {"approval": {"kind": "permission", "title": "Edit src/app.py"}},
                {"output_json": {"verdict": "approve", "issues": 0}},
            )
        )
    )
    with adaptor.Agent(driver, on_approval=adaptor.approve_all) as agent:
        stream = agent.stream("Review the patch", schema=Review)
        for event in stream:
            match event:
                case adaptor.ToolCall(phase="start", name=name):
                    print(f"tool: {name}")
                case adaptor.Notice(kind="approval.resolved", data=data):
                    print(f"approval: {data['kind']} -> {data['result']}")
                case adaptor.TextDelta(phase="content", text=text):
                    print(f"text: {text}")
        result = stream.result()
        review = result.decode(Review)
        print(f"review: {review.verdict} with {review.issues} issues ({result.run_id})")

        # Failures are typed: the same classes a daemon verdict rebuilds.
        failing = adaptor.Agent(
            script.Driver(script.Config(steps=({"fail": {"code": "agent_error", "message": "tests broke"}},)))
        )
        try:
            failing.run("Fix it")
        except adaptor.AgentFailedError as err:
            print(f"failed: {err.reason}: {err.message}")


if __name__ == "__main__":
    main()
