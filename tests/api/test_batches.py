"""OpenAI's Batch API served online, through the official ``openai`` client: an uploaded batch
file's lines are answered in the background as the same calls sent one by one are, counted as
they end; answers go to the output file and the rest to the error file, in order; a cancelled
batch aborts its calls and frees their blocks; files are listed, read and deleted."""

import json
import time

import httpx
import openai
import pytest

from spyglass.core.cli.main import build_parser
from spyglass.core.cli.serve_command import server_options_from_args

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def client(tiny_server):
    return openai.OpenAI(base_url=f"{tiny_server.base_url}/v1", api_key="unused", max_retries=0)


def _line(custom_id: str, body: dict, url: str = CHAT) -> str:
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": url, "body": body})


def _ask(question: str, **extra) -> dict:
    return {
        "model": "tiny",
        "messages": [{"role": "user", "content": question}],
        "max_tokens": 6,
        "temperature": 0,
        **extra,
    }


def _finished(client, batch_id: str, timeout: float = 120):
    deadline = time.monotonic() + timeout
    while (batch := client.batches.retrieve(batch_id)).status in ("in_progress", "finalizing"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.1)
    return batch


def _results(client, file_id: str) -> list[dict]:
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def test_a_batch_answers_its_lines_as_the_same_calls_do(client):
    questions = ["Name a colour.", "Name a city.", "Name a river."]
    lines = [_line(f"q{i}", _ask(q)) for i, q in enumerate(questions)]
    lines.insert(1, _line("wrong-url", {"prompt": "hi"}, url="/v1/completions"))
    lines.append(_line("bad-body", _ask("x", max_tokens=-1)))
    upload = client.files.create(
        file=("questions.jsonl", "\n".join(lines).encode()), purpose="batch"
    )
    assert (upload.purpose, upload.bytes) == ("batch", len("\n".join(lines).encode()))
    batch = client.batches.create(
        input_file_id=upload.id,
        endpoint=CHAT,
        completion_window="24h",
        metadata={"run": "nightly"},
    )
    assert batch.status == "in_progress" and batch.request_counts.total == 5
    batch = _finished(client, batch.id)
    assert batch.status == "completed" and batch.metadata == {"run": "nightly"}
    assert (batch.request_counts.completed, batch.request_counts.failed) == (3, 2)
    answered = _results(client, batch.output_file_id)
    assert [result["custom_id"] for result in answered] == ["q0", "q1", "q2"]
    for result, question in zip(answered, questions):
        alone = client.chat.completions.create(**_ask(question))
        body = result["response"]["body"]
        assert result["response"]["status_code"] == 200
        assert body["choices"][0]["message"]["content"] == alone.choices[0].message.content
    refused = {result["custom_id"]: result for result in _results(client, batch.error_file_id)}
    assert refused["wrong-url"]["response"] is None
    assert "endpoint" in refused["wrong-url"]["error"]["message"]
    assert refused["bad-body"]["response"]["status_code"] == 400
    assert batch.id in [b.id for b in client.batches.list()]


def test_a_cancelled_batch_aborts_its_calls_and_frees_their_blocks(client, tiny_server):
    long = _ask("Tell a long story.", max_tokens=4000, ignore_eos=True)
    lines = "\n".join(_line(f"s{i}", long) for i in range(4))
    upload = client.files.create(file=("stories.jsonl", lines.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    kv = f"{tiny_server.base_url}/debug/kv"
    deadline = time.monotonic() + 60
    while httpx.get(kv).json()["num_requests"] == 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    cancelled = client.batches.cancel(batch.id)
    assert cancelled.status == "cancelled" and cancelled.cancelled_at is not None
    assert cancelled.request_counts.completed < 4
    state = httpx.get(kv).json()
    assert state["num_requests"] == 0 and state["num_free_blocks"] == state["num_blocks"]


def test_files_are_listed_read_and_deleted(client):
    upload = client.files.create(
        file=("one.jsonl", _line("a", _ask("Hi.")).encode()), purpose="batch"
    )
    assert client.files.retrieve(upload.id).filename == "one.jsonl"
    assert upload.id in [f.id for f in client.files.list(purpose="batch")]
    assert json.loads(client.files.content(upload.id).text)["custom_id"] == "a"
    assert client.files.delete(upload.id).deleted is True
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(upload.id)
    with pytest.raises(openai.NotFoundError) as error:
        client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    assert error.value.body["param"] == "input_file_id"
    with pytest.raises(openai.BadRequestError) as error:
        client.files.create(file=("x.jsonl", b"{}"), purpose="fine-tune")
    assert error.value.body["param"] == "purpose"
    with pytest.raises(openai.BadRequestError) as error:  # files here do not expire
        client.files.create(
            file=("x.jsonl", b"{}"),
            purpose="batch",
            expires_after={"anchor": "created_at", "seconds": 3600},
        )
    assert error.value.body["param"].startswith("expires_after")


def test_a_full_queue_holds_a_batchs_lines_back_instead_of_failing_them(
    tiny_llama_dir, server_factory
):
    # Two places in the queue, 64 lines sent at once: the rest are turned away (429) and sent again.
    server = server_factory(
        str(tiny_llama_dir), "--served-model-name", "tiny", "--max-queued-requests", "2"
    )
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    lines = "\n".join(_line(f"q{i}", _ask(f"Count to {i}.")) for i in range(12))
    upload = client.files.create(file=("many.jsonl", lines.encode()), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint=CHAT, completion_window="24h")
    batch = _finished(client, batch.id)
    assert (batch.request_counts.completed, batch.request_counts.failed) == (12, 0)
    assert batch.error_file_id is None


def test_replicas_keep_no_files_or_batches():
    for flags, kept in ((["--replicas", "2"], 0), ([], 64)):
        argv = ["serve", *flags]
        options = server_options_from_args(build_parser(argv).parse_args(argv))
        assert options.batches_store_size == kept
