"""Catalog: lookup, aliases, errors, user files, Hugging Face configs, sources."""

import json
import re
import subprocess
import sys

import pytest

from devices.catalog import (CATALOG_DIR, CatalogError, device_names, device_stacks, get_device, get_model,
                             load_device_file, load_hf_config, load_model_file, model_names, resolve_device,
                             resolve_model)

REQUIRED_DEVICES = {"mi300x", "mi325x", "mi355x", "mi455x", "h100", "h200", "b200", "b300", "gb200", "gb300", "cs3",
                    "a100"}
REQUIRED_MODELS = {"llama-3.1-8b", "llama-3.1-70b", "llama-3.1-405b", "llama-2-70b", "deepseek-v3", "kimi-k2",
                   "qwen3-235b-a22b", "gpt-oss-120b"}


def test_required_entries_exist_and_load():
    assert REQUIRED_DEVICES <= set(device_names())
    assert REQUIRED_MODELS <= set(model_names())
    for k in device_names():
        # a hardware entry with a default stack means that stack's variant
        assert get_device(k).key == k or get_device(k).key in device_stacks(k).values()
    for k in model_names():
        assert get_model(k).key == k


def test_cs3_and_a100_figures():
    cs3 = get_device("cs3")
    assert cs3.memory_bytes == 44e9 and cs3.memory_bandwidth_Bps == 21e15
    assert cs3.scale_out_bandwidth_Bps == 150e9 and cs3.peak_w == 23_000
    a100 = get_device("a100")
    assert a100.memory_bytes == 80 * 2 ** 30 and a100.memory_bandwidth_Bps == pytest.approx(2.039e12)
    assert a100.peak_flops == {"bf16": 312e12}


@pytest.mark.parametrize("name,key", [("MI455X", "mi455x-sglang"), ("CS-3", "cs3-2024q4"), ("wse-3", "cs3-2024q4"),
                                      ("H100 SXM", "h100-sglang"), ("cs3-launch", "cs3-2024-08"),
                                      ("Kimi-K2", "kimi-k2"), ("meta-llama/Llama-3.1-70B-Instruct", "llama-3.1-70b"),
                                      ("LLAMA3.1-70B", "llama-3.1-70b"), ("Llama_2_70B", "llama-2-70b"),
                                      ("deepseek-r1", "deepseek-v3")])
def test_lookup_is_case_insensitive_and_accepts_aliases(name, key):
    getter = get_device if key in device_names() else get_model
    assert getter(name).key == key       # devices: the default stack of the hardware named


def test_unknown_names_suggest_the_closest():
    with pytest.raises(CatalogError, match=r"unknown device 'mi350'.*did you mean.*'mi355x'"):
        get_device("mi350")
    with pytest.raises(CatalogError, match=r"unknown model 'kimi-k3'.*did you mean.*'kimi-k2'"):
        get_model("kimi-k3")


def test_stack_variant_extends_the_hardware():
    base, new = get_device("cs3", stack="2024-08"), get_device("cs3")
    assert new.key == "cs3-2024q4" and base.key == "cs3-2024-08"      # the current stack is the default
    assert new.memory_bytes == base.memory_bytes and new.peak_flops == base.peak_flops
    assert new.layer_latency_s < base.layer_latency_s and new.pipeline_hop_latency_s == 0
    assert "cs3-launch" not in [a.lower() for a in new.aliases]
    assert device_stacks("wse-3") == {"2024-08": "cs3-2024-08", "2024q4": "cs3-2024q4",
                                      "waferengine": "cs3-waferengine"}


def test_a_pool_names_its_stack():
    assert get_device("b200", stack="sglang").key == "b200-sglang"
    assert get_device("b200", stack="TensorRT-LLM").key == "b200-trtllm"       # framework name
    assert get_device("b200").key == "b200-trtllm"                             # the default
    assert get_device("b200-sglang").stack.label == "SGLang 0.5.9"
    with pytest.raises(CatalogError, match=r"no software stack 'vllm'.*stacks: sglang, trtllm"):
        get_device("b200", stack="vllm")


def test_stack_from_borrows_the_software_terms_only():
    h100, h200 = get_device("h100"), get_device("h200")
    assert h100.key == "h100-sglang" and h100.memory_bandwidth_Bps == 3.35e12
    assert h100.iteration_overhead_s == h200.iteration_overhead_s > 0
    assert h100.efficiency == h200.efficiency and h100.stack == h200.stack


def test_every_number_in_the_catalog_has_a_source_comment():
    missing = []
    for path in sorted(CATALOG_DIR.glob("*/*.toml")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if re.match(r"^[a-z_0-9]+\s*=\s*[-+0-9.]", line) and "#" not in line:
                missing.append(f"{path.name}:{i}: {line}")
    assert not missing, "\n".join(missing)


def test_user_device_file(tmp_path):
    p = tmp_path / "my-gpu.toml"
    p.write_text('extends = "h100"\nname = "My H100"\nmemory_bandwidth_Bps = 4e12\n')
    d = load_device_file(p)
    assert d.key == "my-gpu" and d.memory_bandwidth_Bps == 4e12 and d.memory_bytes == 80 * 2 ** 30
    assert resolve_device(str(p)).name == "My H100"


def test_bad_user_device_files_name_file_and_field(tmp_path):
    p = tmp_path / "bad.toml"
    p.write_text('extends = "h100"\nmemory_bytes = -80e9\n')
    with pytest.raises(CatalogError, match=r"bad\.toml: field 'memory_bytes': Input should be greater than 0"):
        load_device_file(p)
    p.write_text('name = "x"\nmemory_bytes = 1e9\n')
    with pytest.raises(CatalogError, match=r"field 'memory_bandwidth_Bps' is required"):
        load_device_file(p)
    p.write_text('name = "x"\nmemory_bytes = = 1\n')
    with pytest.raises(CatalogError, match=r"bad\.toml: not valid TOML.*line 2"):
        load_device_file(p)
    with pytest.raises(CatalogError, match="no such file"):
        load_device_file(tmp_path / "absent.toml")


def test_user_model_toml(tmp_path):
    p = tmp_path / "tiny.toml"
    p.write_text('extends = "llama-3.1-8b"\nname = "Tiny"\nn_layers = 2\n')
    m = load_model_file(p)
    assert m.n_layers == 2 and m.hidden_size == 4096
    assert resolve_model(str(p)).name == "Tiny"


DEEPSEEK_CONFIG = {
    "_name_or_path": "deepseek-ai/DeepSeek-V3", "model_type": "deepseek_v3", "num_hidden_layers": 61,
    "hidden_size": 7168, "num_attention_heads": 128, "num_key_value_heads": 128, "intermediate_size": 18432,
    "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
    "first_k_dense_replace": 3, "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 129280, "tie_word_embeddings": False,
}
GPT_OSS_CONFIG = {
    "model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880, "num_attention_heads": 64,
    "num_key_value_heads": 8, "head_dim": 64, "intermediate_size": 2880, "num_local_experts": 128,
    "num_experts_per_tok": 4, "vocab_size": 201088, "sliding_window": 128, "tie_word_embeddings": False,
    "layer_types": ["sliding_attention", "full_attention"] * 18,
}
QWEN3_CONFIG = {
    "model_type": "qwen3_moe", "num_hidden_layers": 94, "hidden_size": 4096, "num_attention_heads": 64,
    "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 12288, "moe_intermediate_size": 1536,
    "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936, "mlp_only_layers": [],
    "sliding_window": None, "use_sliding_window": False, "tie_word_embeddings": False,
}


@pytest.mark.parametrize("cfg,key", [(DEEPSEEK_CONFIG, "deepseek-v3"), (GPT_OSS_CONFIG, "gpt-oss-120b"),
                                     (QWEN3_CONFIG, "qwen3-235b-a22b")])
def test_hf_config_matches_the_catalog(tmp_path, cfg, key):
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    m = load_hf_config(tmp_path)
    ref = get_model(key)
    assert m.params_total == ref.params_total and m.params_active == ref.params_active
    assert m.kv_bytes_per_token("bf16") == ref.kv_bytes_per_token("bf16")
    assert m.n_sliding_layers == ref.n_sliding_layers
    assert resolve_model(str(tmp_path / "config.json")).params_total == ref.params_total


def test_bad_hf_configs(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({k: v for k, v in DEEPSEEK_CONFIG.items() if k != "hidden_size"}))
    with pytest.raises(CatalogError, match="missing field 'hidden_size'"):
        load_hf_config(p)
    p.write_text(json.dumps({**DEEPSEEK_CONFIG, "num_hidden_layers": "61"}))
    with pytest.raises(CatalogError, match="'num_hidden_layers' should be an integer"):
        load_hf_config(p)
    p.write_text("{not json")
    with pytest.raises(CatalogError, match="not valid JSON"):
        load_hf_config(p)


def test_import_devices_is_light():
    code = ("import sys, devices; assert 'pydantic' not in sys.modules and 'numpy' not in sys.modules; "
            "devices.get_model('kimi-k2'); devices.CostModel('llama-3.1-8b', 'h100').decode_steps([10], 2); "
            "bad = [m for m in ('ray', 'matplotlib') if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
