"""Kimi-K2.6 in the catalog: Kimi K2's text model with a 256K context."""

from devices.catalog import get_model


def test_kimi_k26_differs_from_kimi_k2_only_in_context_and_labels():
    k2, k26 = get_model("kimi-k2"), get_model("moonshotai/Kimi-K2.6")
    assert k26.key == "kimi-k2.6" and get_model("Kimi 2.6").key == "kimi-k2.6"
    assert get_model("k2").key == "kimi-k2"              # K2's names still name K2
    a, b = k2.model_dump(), k26.model_dump()
    differs = {k for k in a if a[k] != b[k]}
    # and the weights' native format: INT4 experts (0.5 byte, as fp4) against K2's fp8
    assert differs == {"key", "name", "description", "aliases", "max_context_tokens", "published_params_total",
                       "native_dtype"}
    assert (k2.max_context_tokens, k26.max_context_tokens) == (131072, 262144)
    # same weights and KV per token, so the same memory plan per token of context
    assert k26.kv_bytes_per_token("fp8") == k2.kv_bytes_per_token("fp8")
