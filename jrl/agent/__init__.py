"""Multi-turn agent loops (verl's ``rollout.multi_turn`` and ``rollout.agent``): the loop API and
its registry, the tool and interaction lifecycles, and `AgentRollout`, the rollout that runs a
loop per row over any engine.

Names are imported on first use (`jrl.lazy`)."""

from jrl.lazy import lazy_exports

__all__, __getattr__ = lazy_exports(
    __name__,
    {
        "AgentContext": "jrl.agent.context",
        "AgentLoopBase": "jrl.agent.loop",
        "AgentLoopOutput": "jrl.agent.loop",
        "AgentRollout": "jrl.agent.rollout",
        "AgentSettings": "jrl.agent.settings",
        "BaseInteraction": "jrl.agent.interactions",
        "BaseTool": "jrl.agent.tools.base",
        "ToolResponse": "jrl.agent.tools.base",
        "function_tool": "jrl.agent.tools.function",
        "register": "jrl.agent.loop",
    },
)
