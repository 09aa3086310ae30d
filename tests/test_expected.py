import pytest

from nbtools import OutputMismatch, assert_matches, match, parse_kv


def test_in_line_wildcard_matches_within_a_line_only():
    assert match("device=npu final_loss=xxx", "device=npu final_loss=0.1234")
    assert not match("device=npu final_loss=xxx", "device=cpu final_loss=0.1234")
    assert not match("Python 3.12.xxx", "Python 3.12.1\nextra line")


def test_any_lines_wildcard_matches_zero_or_more_lines():
    exp = "...\nworld=2\n..."
    assert match(exp, "world=2")
    assert match(exp, "warning a\nwarning b\nworld=2\ntrailer")
    assert not match(exp, "world=1")


def test_seed_acc_env_block():
    exp = """...
Copy-and-paste the text below in your GitHub issue
- `Accelerate` version: xxx
- PyTorch accelerator: NPU
..."""
    out = "\nCopy-and-paste the text below in your GitHub issue\n\n- `Accelerate` version: 1.15.0\n- PyTorch accelerator: NPU\n- CANN version: 9.1.0\n"
    assert match(exp, out)
    assert not match(exp, out.replace("NPU", "N/A"))


def test_failure_shows_both_sides_and_first_difference():
    with pytest.raises(OutputMismatch) as err:
        assert_matches("a=1\nb=2\nc=3", "a=1\nb=5\nc=3")
    text = str(err.value)
    assert "预期" in text and "实际输出" in text and text.startswith("输出与预期的块不一致")
    assert "第一处不同：预期第 2 行 'b=2'，输出第 2 行 'b=5'" in text
    assert isinstance(err.value, AssertionError)


def test_extra_output_is_a_mismatch():
    m = match("a", "a\nb")
    assert not m
    assert "<预期的块已结束>" in m.report()


def test_parse_kv_reads_pairs_and_ignores_prose():
    text = (
        "device=npu final_loss=0.0123\n"
        "gathered=[1, 2, 3, 1, 2, 3]\n"
        "[rank0]: world=2\n"
        "some prose with a=b inside\n"
        "- PyTorch accelerator: N/A\n"
    )
    assert parse_kv(text) == {
        "device": "npu",
        "final_loss": "0.0123",
        "gathered": "[1, 2, 3, 1, 2, 3]",
        "world": "2",
    }


def test_parse_kv_reads_colon_pairs_and_spaced_equals():
    text = "torch= 2.14.1+cu130\ntorch_npu= not installed\nis_available: True\ncount: 2\n- PyTorch accelerator: NPU\n"
    assert parse_kv(text) == {"torch": "2.14.1+cu130", "torch_npu": "not installed", "is_available": "True", "count": "2"}
    assert parse_kv("[rank1]: world: 2\nratio: \n") == {"world": "2"}  # a key without a value is not a pair


def test_same_version_compares_public_versions():
    from nbtools import public_version, same_version

    assert same_version("2.14.1", "2.14.1+cu130")  # the "any torch" bug: metadata vs torch.__version__
    assert same_version("2.9.0+cpu", "2.9.0")
    assert same_version("2.1.0a0+git1234abc", "2.1.0a0")
    assert not same_version("2.9.0", "2.9.0.post2")
    assert not same_version("2.9.0", "2.14.1")
    assert not same_version(None, "2.9.0") and not same_version("2.9.0", None)
    assert public_version("not a version+x") == "not a version"


def test_installed_and_editable_read_package_metadata(tmp_path, monkeypatch):
    import json

    from nbtools import editable, installed

    assert installed("no-such-distribution-xyz") is None and not editable("no-such-distribution-xyz")
    assert installed("psutil")  # a dependency of nbtools
    info = tmp_path / "fake_pkg-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-pkg\nVersion: 1.0\n")
    (info / "direct_url.json").write_text(json.dumps({"url": "file:///x", "dir_info": {"editable": True}}))
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed("fake-pkg") == "1.0" and editable("fake-pkg")
    (info / "direct_url.json").write_text(json.dumps({"url": "file:///x", "dir_info": {}}))
    assert not editable("fake-pkg")
