"""The README's client example: ask the running server through the official openai SDK, then report on it.

Start the server first (`.venv/bin/python scripts/serve.py`), then `.venv/bin/python scripts/quickstart_client.py`.
"""

import openai
import requests

client = openai.OpenAI(base_url="http://127.0.0.1:8900/v1", api_key="unused",
                       default_headers={"x-reef-scenario": "quickstart"})
raw = client.chat.completions.with_raw_response.create(
    model="SmolLM2-135M-Instruct", max_tokens=32, messages=[{"role": "user", "content": "What is 2+2?"}])
receipt = raw.headers["x-reef-agent-record-id"]
print(raw.parse().choices[0].message.content, receipt)

r = requests.post("http://127.0.0.1:8900/reef/report", headers={"x-reef-scenario": "quickstart"},
                  json={"score": 1.0, "feedback": "correct", "references": [receipt]})
print(r.status_code, r.json())   # 200 {'agent_record_id': 'rec_...', 'scenario': 'quickstart', ...}
