"""The lookup task's strings (`jrl.data.lookup`), in a module without dependencies so that its
reward (`jrl.reward.lookup`) reads them without loading a tokenizer library."""

DATA_SOURCE = "jrl/lookup"
# The whole tool call (Hermes format) is one token of the task's vocabulary.
CALL = '<tool_call>{"name": "lookup", "arguments": {}}</tool_call>'
# The chat template writes a tool turn as this mark and the tool's answer.
TOOL_MARK = "@"
