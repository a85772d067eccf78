"""The SDK in an asyncio program (docs/sdk.md, "From asyncio").

Runs block, so each goes to a worker thread with ``asyncio.to_thread``; a task cancelled
(``task.cancel()``, ``asyncio.timeout``, Ctrl-C under ``asyncio.run``) cancels its run too,
which stops the agent: cancelling the awaiting task alone would leave the run going.
"""

from __future__ import annotations

import asyncio

import adaptor
from adaptor.drivers import script


async def run(agent: adaptor.Agent, prompt: str) -> adaptor.Result:
    stream = agent.stream(prompt)
    try:
        return await asyncio.to_thread(stream.result)
    except asyncio.CancelledError:
        stream.cancel()
        raise


async def main() -> None:
    quick = adaptor.Agent(script.Driver(script.Config(steps=({"text": "hello"},))))
    slow = adaptor.Agent(script.Driver(script.Config(steps=({"sleep": 60}, {"text": "late"}))))
    with quick, slow:
        results = await asyncio.gather(*(run(quick, f"prompt {i}") for i in range(3)))
        print("gathered:", [result.text for result in results])
        stream_of_slow = asyncio.create_task(run(slow, "take your time"))
        try:
            async with asyncio.timeout(0.5):
                await stream_of_slow
        except TimeoutError:
            print("timed out: the slow run was cancelled")
    print("closed")


if __name__ == "__main__":
    asyncio.run(main())
