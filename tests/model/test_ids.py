import pytest

from farm.model.ids import engine_name_to_id, fnv1a_64, policy_name_to_id, to_int64


# Reference vectors of the FNV-1a 64-bit hash (Fowler/Noll/Vo test suite).
@pytest.mark.parametrize(
    "data, expected",
    [
        (b"", 0xCBF29CE484222325),
        (b"a", 0xAF63DC4C8601EC8C),
        (b"b", 0xAF63DF4C8601F1A5),
        (b"foobar", 0x85944171F73967E8),
        (b"chongo was here!\n", 0x46810940EFF5F915),
    ],
)
def test_fnv1a_64_reference_vectors(data, expected):
    assert fnv1a_64(data) == expected


def test_ids_are_signed_int64():
    # 0xAF63... has the top bit set, so the signed id is negative
    assert engine_name_to_id("a") == 0xAF63DC4C8601EC8C - (1 << 64)
    assert -(1 << 63) <= engine_name_to_id("cpu.matmul.blas") < (1 << 63)
    assert to_int64(0x7FFFFFFFFFFFFFFF) == 0x7FFFFFFFFFFFFFFF
    assert to_int64(0x8000000000000000) == -(1 << 63)


def test_names_hash_utf8_and_policy_ids_use_the_same_function():
    assert engine_name_to_id("é") == to_int64(fnv1a_64("é".encode("utf-8")))
    assert policy_name_to_id("SelectionHeuristic::Config") == engine_name_to_id("SelectionHeuristic::Config")
    assert engine_name_to_id("x") != engine_name_to_id("y")


@pytest.mark.parametrize("bad", ["", None, 7])
def test_empty_or_non_string_names_are_rejected(bad):
    with pytest.raises(ValueError):
        engine_name_to_id(bad)
