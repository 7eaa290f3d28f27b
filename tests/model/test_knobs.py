import math

import pytest

from farm.errors import InputError
from farm.model.knobs import Knob, KnobType, format_settings, knob_type_of, normalize_settings, resolve

TILE = Knob.int("tile", 64, choices=(32, 64, 128))
SPLIT = Knob.int("split_k", 1, min=1, max=16)
ALPHA = Knob.float("alpha", 1.0, min=0.0, max=2.0)
MODE = Knob.str("mode", "fast", choices=("fast", "exact"))


def test_types_coerce_and_validate():
    assert TILE.validate(128, engine="e") == 128
    assert TILE.validate(128.0, engine="e") == 128 and isinstance(TILE.validate(128.0, engine="e"), int)
    assert ALPHA.validate(1, engine="e") == 1.0 and isinstance(ALPHA.validate(1, engine="e"), float)
    assert MODE.validate("exact", engine="e") == "exact"


@pytest.mark.parametrize(
    "knob, value, fragment",
    [
        (TILE, 48, "one of [32, 64, 128]"),
        (TILE, "64", "expected an integer"),
        (TILE, True, "expected an integer"),
        (TILE, 64.5, "expected an integer"),
        (SPLIT, 0, ">= 1"),
        (SPLIT, 17, "<= 16"),
        (ALPHA, math.nan, "finite"),
        (ALPHA, 2.5, "<= 2"),
        (MODE, "slow", "one of"),
        (MODE, 1, "expected a string"),
    ],
)
def test_validation_errors_name_engine_knob_and_value(knob, value, fragment):
    with pytest.raises(InputError) as info:
        knob.validate(value, engine="cpu.matmul.x")
    text = str(info.value)
    assert fragment in text
    assert "cpu.matmul.x" in text and knob.name in text
    assert repr(value) in text


def test_definitions_are_checked():
    with pytest.raises(ValueError):
        Knob.str("m", "a", choices=())
    with pytest.raises(InputError):
        Knob.int("t", 7, choices=(1, 2))  # default not a choice
    with pytest.raises(ValueError):
        Knob(name="x", type=KnobType.INT, default=1, min=0, choices=(1,))


def test_normalize_drops_defaults_sorts_and_rejects_unknown():
    knobs = (TILE, SPLIT, MODE)
    assert normalize_settings(knobs, {"split_k": 4, "tile": 32}, engine="e") == (("split_k", 4), ("tile", 32))
    assert normalize_settings(knobs, [("tile", 32), ("split_k", 4)], engine="e") == (("split_k", 4), ("tile", 32))
    assert normalize_settings(knobs, {"tile": 64, "mode": "fast"}, engine="e") == ()
    with pytest.raises(InputError) as info:
        normalize_settings(knobs, {"tiles": 32}, engine="e")
    assert "unknown knob" in str(info.value) and "tiles" in str(info.value)


def test_resolve_and_format():
    assert resolve((TILE, MODE), (("tile", 32),)) == {"tile": 32, "mode": "fast"}
    assert format_settings(()) == "default"
    assert format_settings((("a", 1), ("b", "x"))) == "a=1,b=x"
    assert knob_type_of(1) is KnobType.INT and knob_type_of(1.5) is KnobType.FLOAT and knob_type_of("s") is KnobType.STR
    assert KnobType.parse("float") is KnobType.FLOAT and KnobType.FLOAT.value == "double"
    with pytest.raises(InputError):
        KnobType.parse("complex")


def test_describe_shows_range_choices_default():
    assert TILE.describe() == "tile: int in {32, 64, 128} = 64"
    assert SPLIT.describe() == "split_k: int in [1, 16] = 1"
    assert MODE.describe() == "mode: string in {fast, exact} = fast"
