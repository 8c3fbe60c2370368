"""SSE decoding and the per-server chunk shapes (vLLM, SGLang, TGI, Ollama, llama.cpp, llama-cpp-python)."""

from __future__ import annotations

import json

import pytest

from speedlimit.bench.sse import MalformedSSE, SSEDecoder, interpret_event


def test_decoder_reassembles_events_split_across_reads_and_crlf():
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a"') == []
    assert decoder.feed(b': 1}\r\n') == []
    assert decoder.feed(b"\r\ndata: [DONE]\n\n") == [("message", '{"a": 1}'), ("message", "[DONE]")]


def test_decoder_skips_comments_joins_multiline_data_and_keeps_event_names():
    decoder = SSEDecoder()
    events = decoder.feed(b": ping - 2024-01-01\n\ndata: line1\ndata: line2\n\nevent: error\ndata: {}\n\n")
    assert events == [("message", "line1\nline2"), ("error", "{}")]


def test_decoder_flushes_an_unterminated_last_event():
    decoder = SSEDecoder()
    assert decoder.feed(b"data: [DONE]") == []
    assert decoder.close() == [("message", "[DONE]")]


def completion(text, finish=None, usage=None):
    obj = {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}]}
    if usage is not False:
        obj["usage"] = usage
    return json.dumps(obj)


def test_llama_cpp_python_completion_chunks():
    assert interpret_event("message", completion(" Paris", usage=False)).text == " Paris"
    final = interpret_event("message", completion("", "length", usage=False))
    assert final.text == "" and final.finish_reason == "length" and final.usage is None
    assert interpret_event("message", "[DONE]").done


def test_openai_vllm_sglang_ollama_usage_chunk_has_empty_choices():
    event = interpret_event("message", json.dumps(
        {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}))
    assert event.text == "" and event.usage["completion_tokens"] == 7
    # usage: null on ordinary chunks is not usage
    assert interpret_event("message", completion("x", usage=None)).usage is None


def test_vllm_continuous_usage_and_tgi_usage_on_the_finish_chunk():
    running = interpret_event("message", completion("ab", usage={"prompt_tokens": 3, "completion_tokens": 2}))
    assert running.text == "ab" and running.usage["completion_tokens"] == 2
    tgi = {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
           "finish_reason": "length"}], "usage": {"prompt_tokens": 4, "completion_tokens": 9, "total_tokens": 13}}
    event = interpret_event("message", json.dumps(tgi))
    assert event.finish_reason == "length" and event.usage["completion_tokens"] == 9 and event.text == ""


def test_chat_role_only_delta_is_not_a_token_but_reasoning_is():
    role = {"choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]}
    assert interpret_event("message", json.dumps(role)).text == ""
    reasoning = {"choices": [{"index": 0, "delta": {"reasoning_content": "hmm"}, "finish_reason": None}]}
    assert interpret_event("message", json.dumps(reasoning)).text == "hmm"
    ollama = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": "Hi", "reasoning": "r"}}]}
    assert interpret_event("message", json.dumps(ollama)).text == "Hir"


def test_in_stream_errors_are_errors():
    assert interpret_event("message", '{"error": {"message": "boom", "code": 500}}').error == "boom"
    assert interpret_event("message", '{"error": "Input validation error", "error_type": "validation"}').error
    assert interpret_event("error", '{"message": "overloaded"}').error == "overloaded"


@pytest.mark.parametrize("payload", ["{not json", "[1, 2]", '"text"', '{"unexpected": 1}'])
def test_malformed_payloads_raise(payload):
    with pytest.raises(MalformedSSE):
        interpret_event("message", payload)


def test_llama_cpp_native_stream_says_where_the_openai_api_is():
    """llama-server answers /completions at its root in its own format (content/stop, no choices): a --url without
    /v1 gets there, and every request fails; the error says to add /v1."""
    native = '{"index":0,"content":" on","tokens":[335],"stop":false,"id_slot":-1,"tokens_predicted":1}'
    with pytest.raises(MalformedSSE, match="under /v1"):
        interpret_event("message", native)
