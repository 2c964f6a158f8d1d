"""A user's device file that extends a bare catalog device keeps that device's default
software stack, as `device = "h100"` does (issue 24: it silently ran a roofline H100,
TPOT 17.11 vs SGLang's 15.71 ms); `extends_stack` picks another stack of the hardware."""

from __future__ import annotations

import pytest

from devices.catalog import CatalogError, get_device, load_device_file


def test_extends_keeps_the_default_stack(tmp_path):
    p = tmp_path / "my-h100.toml"
    p.write_text('extends = "h100"\nname = "My H100"\n')
    mine, catalog = load_device_file(p), get_device("h100")
    assert mine.stack.key == catalog.stack.key == "sglang"
    assert mine.model_dump(exclude={"key", "name"}) == catalog.model_dump(exclude={"key", "name"})


def test_extends_stack_names_another_stack_or_the_bare_hardware(tmp_path):
    p = tmp_path / "bare.toml"
    p.write_text('extends = "h100"\nextends_stack = "roofline"\n')
    assert load_device_file(p).stack.key == "roofline"
    p.write_text('extends = "h100"\nextends_stack = "nope"\n')
    with pytest.raises(CatalogError, match=r"bare\.toml: field 'extends_stack': device 'h100' has no software "
                                           r"stack 'nope' in the catalog \(stacks: sglang"):
        load_device_file(p)
    p.write_text('extends_stack = "sglang"\nname = "x"\n')
    with pytest.raises(CatalogError, match="field 'extends_stack': needs `extends`"):
        load_device_file(p)


def test_a_variant_named_explicitly_is_used_as_written(tmp_path):
    p = tmp_path / "v.toml"
    p.write_text('extends = "h100-sglang"\n')
    assert load_device_file(p).stack.key == "sglang"
