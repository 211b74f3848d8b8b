"""The settings dataclasses: every field of every config is checked when the config is made (its type, finite, its
range), and a refusal names the field, shows the value and states the rule."""

from __future__ import annotations

import dataclasses
import math

import pytest

from nbhelpers.batch import BatchConfig
from nbhelpers.config import InferenceConfig
from nbhelpers.errors import InputError
from nbhelpers.live import LiveConfig

pytestmark = pytest.mark.notorch

NAN, INF = math.nan, math.inf
# Values that no field of that kind takes: text for a number, a bool for a whole number (bool is an int to
# Python), a float for a whole number, NaN and infinity, None where None means nothing.
WHOLE = ("10", True, 2.5, NAN, INF, [1])
NUMBER = ("0.1", True, NAN, INF, -INF, [0.1])
TEXT = (3, True, b"cpu")
SWITCH = (1, "yes", 0.0)

# Every field of every config -> (values refused, values taken). None is refused where the field has no meaning for
# it; ranges are refused just past each end and taken at each end.
TABLE = {
    InferenceConfig: {
        "version": ((*TEXT, None, "v2"), ("v15", "v1")),
        "batch_size": ((*WHOLE, 0, -1), (None, 1, 64)),
        "fp16": ((*SWITCH, "auto"), (None, True, False)),
        "device": ((*TEXT, "gpu", "cuda:x"), (None, "cpu", "cuda", "cuda:1")),
        "extra_margin": ((*WHOLE, None, -1, 201), (0, 200)),
        "bbox_shift": ((*WHOLE, None, -201, 201), (-200, 200)),
        "parsing_mode": ((*TEXT, None, "chin"), ("jaw", "raw", "neck")),
        "left_cheek_width": ((*WHOLE, None, -1, 257), (0, 256)),
        "right_cheek_width": ((*WHOLE, None, -1, 257), (0, 256)),
        "landmark_backend": ((*TEXT, None, "face"), ("auto", "dlib", "boxes")),
        "smooth_boxes": ((*WHOLE, None, -1), (0, 9)),
        "seed": ((*WHOLE, None, -1, 2**63, int("1" * 31)), (0, 2**63 - 1)),
        "latent_mode": ((*TEXT, None, "mean"), ("sample", "mode")),
        "blur_ratio": ((*NUMBER, None, 0.0, 0.51), (0.01, 0.5)),
        "encoder": ((*TEXT, None, "h265"), ("libx264", "nvenc")),
        "restore": ((*TEXT, "gfp"), (None, "gfpgan")),
        "restore_strength": ((*NUMBER, None, -0.01, 1.01), (0.0, 1.0, 1)),
        "compile": ((*TEXT, None, "yes"), ("auto", "on", "off")),
        "face": ((True, 2.5, NAN, None, -1, b"0", "left", "1,2,3", "5,5,1,1"),
                 ("largest", "speaker", 0, 3, "10,20", "10,20,30,40@2")),
    },
    LiveConfig: {
        "realtime": ((*SWITCH, None), (True, False)),
        "delay_s": ((*NUMBER, None, -0.01), (0.0, 2)),
        "guard_s": ((*NUMBER, None, -0.01), (0.0, 0.5)),
        "hop": ((*WHOLE, None, 0), (1, 8)),
        "lookahead_ms": ((*NUMBER, None, -1.0), (0.0, 80)),
        "context": ((*TEXT, None, "all"), ("sliding", "segment")),
        "silence": ((*TEXT, "none", "quiet"), ("closed", "source", None)),
        "silence_db": ((*NUMBER, None, 0.1), (-60.0, 0.0, -90)),
        "to": ((3, True, NAN), (None, "out.mp4", "rtmp://host/live")),
        "encoder": ((*TEXT, "x265"), (None, "libx264", "nvenc")),
        "iterate": ((*SWITCH,), (None, True, False)),
        "max_queue": ((*WHOLE, None, -1), (0, 50)),
        "threaded": ((*SWITCH, None), (True, False)),
        "batch_size": ((*WHOLE, 0), (None, 1, 20)),
        "ahead_s": ((*NUMBER, None, -0.5), (0.0, 1.0)),
        "warm_up": ((*SWITCH, None), (True, False)),
    },
    BatchConfig: {
        "address": ((3, True, NAN), (None, "auto", "ray://host:10001")),
        "cache_dir": ((3, True, NAN), (None, "cache")),
        "summary": ((3, NAN), (None, "s.csv", False, True)),
        "cpu_workers": ((*WHOLE, None, 0), (1, 4)),
        "workers_per_gpu": ((*WHOLE, 0), (None, 1, 3)),
        "jobs_per_worker": ((*WHOLE, 0), (None, 1, 2)),
        "gpus": ((*WHOLE, -1), (None, 0, 8)),
        "max_attempts": ((*WHOLE, None, 0), (1, 5)),
        "rerun": ((*SWITCH, None), (True, False)),
    },
}

CASES = [(cls, name, value) for cls, fields in TABLE.items() for name, (bad, _) in fields.items() for value in bad]
GOOD = [(cls, name, value) for cls, fields in TABLE.items() for name, (_, good) in fields.items() for value in good]


def _id(case):
    return f"{case[0].__name__}.{case[1]}={case[2]!r}"


def test_the_table_covers_every_field_of_every_config():
    for cls, fields in TABLE.items():
        settings = {f.name for f in dataclasses.fields(cls) if f.name != "reasons"}
        assert set(fields) == settings, cls.__name__


@pytest.mark.parametrize("case", CASES, ids=map(_id, CASES))
def test_a_bad_value_is_refused_naming_the_field_the_value_and_the_rule(case):
    cls, name, value = case
    with pytest.raises(InputError) as caught:
        cls(**{name: value})
    text = str(caught.value)
    assert text.startswith(f"{name} must be "), text
    assert f"got {value!r}" in text, text


@pytest.mark.parametrize("case", GOOD, ids=map(_id, GOOD))
def test_a_good_value_is_taken(case):
    cls, name, value = case
    assert getattr(cls(**{name: value}), name) == value


def test_numbers_are_stored_as_plain_python_numbers():
    np = pytest.importorskip("numpy")
    config = InferenceConfig(extra_margin=np.int64(12), blur_ratio=np.float32(0.25), restore_strength=1)
    assert type(config.extra_margin) is int and type(config.blur_ratio) is float
    assert type(config.restore_strength) is float and config.to_dict()["extra_margin"] == 12


def test_the_seed_rule_is_said_and_text_for_a_number_is_named_as_text():
    with pytest.raises(InputError, match=r"^seed must be a whole number >= 0 and < 2\*\*63; got 1111"):
        InferenceConfig(seed=int("1" * 31))
    with pytest.raises(InputError, match=r"^extra_margin must be a whole number of pixels from 0 to 200; got '10' "
                                         r"\(text\)\."):
        InferenceConfig(extra_margin="10")


def test_compile_takes_the_compiler_modes_and_is_no_part_of_an_outputs_key():
    from nbhelpers.gpu.compile import COMPILE_MODES

    assert COMPILE_MODES == ("auto", "on", "off") and InferenceConfig().compile == "auto"
    off = InferenceConfig(compile="off")
    assert "compile" not in off.output_settings() and off.output_settings() == InferenceConfig().output_settings()
    assert "device" not in off.output_settings() and "extra_margin" in off.output_settings()


@pytest.mark.parametrize(("config", "typo", "near"), [
    (InferenceConfig, "bbox_shfit", "bbox_shift"), (LiveConfig, "lookahead", "lookahead_ms"),
    (BatchConfig, "max_attempt", "max_attempts")])
def test_a_misspelt_setting_names_the_nearest_and_where_settings_are_described(config, typo, near):
    """A misspelt keyword was Python's bare "__init__() got an unexpected keyword argument"; replace() says the
    same. The error is a TypeError too, as Python's own for an unknown keyword."""
    name = config.__name__
    for make in (config, config().replace if hasattr(config, "replace") else config):
        with pytest.raises(InputError, match=rf"^{name} has no setting {typo!r}; did you mean {near!r}\? help\("
                                             rf"nbhelpers\.config\.{name}\) describes each setting\.$") as e:
            make(**{typo: 1})
        assert isinstance(e.value, TypeError)


def test_a_setting_name_near_none_lists_the_settings():
    with pytest.raises(InputError, match=r"^BatchConfig has no setting 'zzz'; its settings are address, cache_dir, "
                                         r".*, rerun\. help\(nbhelpers\.config\.BatchConfig\) describes each "
                                         r"setting\.$"):
        BatchConfig(zzz=1)
