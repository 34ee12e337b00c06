"""The wire: the providers' dialects, read and written in one place.

Every module here reads or writes a dialect (OpenAI chat completions, OpenAI Responses, Anthropic messages) and
imports nothing above the engines: the gateway, the learners, the harness and the tasks use it, never the other
way round (tests/test_layout.py).
- `dialects`: a request body to the engines' ChatRequest (sampling, tools, tool_choice), read by translate/'s
  reader of its dialect (strictly: what an engine here serves); error events;
- `text`: any dialect's recorded request and response as text and tool calls (records, learners, apps), through
  translate/'s readers;
- `tools`, `responses_tools`: the checks of requests' tool parts an engine needs (Responses' hosted and custom tools
  mapped to functions), and Responses' tool kinds written back;
- `answers`: an engine's generation written as each dialect's answer, whole or streamed; server-sent events and a
  relayed stream's receipt-bearing end;
- `accumulate`: a relayed stream put back together into one response;
- `translate/`: the neutral form (ir.py) and the one reader and one writer per dialect: the relay's, and generation's
  reader.

The dialect names, once: below. (The upstream engine's `--upstream-dialect` words map onto them; a test checks.)
"""

OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC = "openai.chat", "openai.responses", "anthropic.messages"
DIALECTS = (OPENAI_CHAT, OPENAI_RESPONSES, ANTHROPIC)
PATHS = {OPENAI_CHAT: "/v1/chat/completions", OPENAI_RESPONSES: "/v1/responses", ANTHROPIC: "/v1/messages"}
