"""Hardware profiles: built-ins, JSON round trip, and the validation errors users see."""

from __future__ import annotations

import json

import pytest

from cost_models.hardware import BUILTIN_PROFILES, HardwareProfile, ProfileError, load_profile


def test_builtins_exist_and_cite_sources():
    for name in ("a100-80gb", "h100-80gb", "cpu-gloo"):
        p = load_profile(name)
        assert p.name == name and len(p.source) > 40
    assert load_profile("h100-80gb").peak_flops["bf16"] > load_profile("a100-80gb").peak_flops["bf16"]
    assert load_profile("cpu-gloo").device == "cpu" and load_profile("a100-80gb").device == "cuda"


def test_save_and_load_round_trip(tmp_path):
    data = BUILTIN_PROFILES["a100-80gb"].to_json()
    data["name"] = "measured"
    data["overrides"] = {"inter:all_gather": [2e-5, 4e-11]}
    p = HardwareProfile.from_json(data)
    path = tmp_path / "profile.json"
    p.save(path)
    assert not list(tmp_path.glob("*.tmp"))  # the atomic write leaves no temporary behind
    q = load_profile(str(path))
    assert q == p and hash(q) == hash(p)
    assert q.alpha_beta("inter", "all_gather") == (2e-5, 4e-11)
    assert q.alpha_beta("intra", "all_gather") == (p.intra_alpha, p.intra_beta)


def test_unknown_name_lists_known_profiles():
    with pytest.raises(ProfileError, match=r"unknown hardware profile 'v100'.*a100-80gb.*cpu-gloo.*h100-80gb"):
        load_profile("v100")


def test_non_json_file(tmp_path):
    path = tmp_path / "p.json"
    path.write_text("alpha = 1")
    with pytest.raises(ProfileError, match="not valid JSON"):
        load_profile(str(path))


def test_missing_field(tmp_path):
    data = BUILTIN_PROFILES["h100-80gb"].to_json()
    del data["inter_beta"]
    path = tmp_path / "p.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=r"missing field\(s\) \['inter_beta'\]"):
        load_profile(str(path))


@pytest.mark.parametrize("field, value, message", [
    ("mem_bandwidth", 0, "mem_bandwidth must be positive"),
    ("intra_beta", -1e-9, "beta of intra must be positive"),
    ("inter_alpha", -1e-6, "alpha of inter must be >= 0"),
    ("efficiency", 1.5, "efficiency must be in"),
    ("device", "tpu", "device must be one of"),
    ("gpus_per_node", "eight", "must be an integer"),
])
def test_impossible_values(field, value, message):
    data = BUILTIN_PROFILES["a100-80gb"].to_json()
    data[field] = value
    with pytest.raises(ProfileError, match=message):
        HardwareProfile.from_json(data)


def test_non_positive_flops_and_bad_override():
    data = BUILTIN_PROFILES["a100-80gb"].to_json()
    data["peak_flops"] = {"fp32": 0}
    with pytest.raises(ProfileError, match=r"peak_flops\[fp32\] must be positive"):
        HardwareProfile.from_json(data)
    data = BUILTIN_PROFILES["a100-80gb"].to_json()
    data["overrides"] = {"intra:gossip": [1e-6, 1e-9]}
    with pytest.raises(ProfileError, match="override key intra:gossip"):
        HardwareProfile.from_json(data)
    assert issubclass(ProfileError, ValueError)


def test_broadcast_algorithm_round_trips_and_is_checked(tmp_path):
    # gloo's profile prices broadcasts on its binomial tree; the field survives save/load, stays out of the
    # JSON of profiles that use the default, and a misspelt value names the choices.
    gloo = BUILTIN_PROFILES["cpu-gloo"]
    assert gloo.broadcast_algorithm == "binomial" and BUILTIN_PROFILES["a100-80gb"].broadcast_algorithm == "pipelined"
    assert "broadcast_algorithm" not in BUILTIN_PROFILES["a100-80gb"].to_json()
    path = tmp_path / "gloo.json"
    gloo.save(path)
    assert load_profile(str(path)) == gloo and load_profile(str(path)).broadcast_algorithm == "binomial"
    data = gloo.to_json()
    data["broadcast_algorithm"] = "ring"
    with pytest.raises(ProfileError, match=r"broadcast_algorithm must be one of \('pipelined', 'binomial'\)"):
        HardwareProfile.from_json(data)
