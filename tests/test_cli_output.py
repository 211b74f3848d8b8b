"""``-o`` given an existing folder writes the clip into it under the default name, as ``cp FILE DIR`` does; only
a name that is neither a folder nor a .mp4 is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from nbhelpers.errors import InputError


@pytest.mark.slow
def test_lipsync_writes_into_an_existing_output_folder(grey_clip, tone_1s, tiny_weights, tmp_path, capsys):
    from nbhelpers import media
    from nbhelpers.cli.main import main

    folder = tmp_path / "clips"
    folder.mkdir()
    assert main(["lipsync", str(grey_clip), str(tone_1s), "-o", str(folder), "--weights", str(tiny_weights),
                 "--device", "cpu", "--box=16,16,112,112"]) == 0
    out = folder / f"{grey_clip.stem}_{tone_1s.stem}.mp4"
    assert capsys.readouterr().out.splitlines()[0].endswith(f"-> {out}")
    assert media.probe(out).frame_count == 25


def test_an_output_neither_mp4_nor_a_folder_says_both_choices(tmp_path):
    from nbhelpers.checks import output_path_for

    with pytest.raises(InputError, match=r"^output must end in \.mp4 or be an existing folder; got '.*/out'\.$"):
        output_path_for(tmp_path / "out", tmp_path / "v.mp4", tmp_path / "a.wav")
    assert output_path_for(tmp_path, tmp_path / "v.mp4", tmp_path / "a.wav") == tmp_path / "v_a.mp4"


def test_an_output_ending_in_a_separator_is_a_folder_to_make(tmp_path, tone_1s, monkeypatch):
    """``-o new/`` names a folder, as a shell user writes one: the default name goes in it, and the folder is made
    with the file. Without the separator, a name that is not .mp4 is still refused."""
    from nbhelpers.checks import names_folder, output_path_for

    new = f"{tmp_path}/new/"
    assert names_folder(new) and names_folder(tmp_path) and not names_folder(f"{tmp_path}/new")
    assert output_path_for(new, tmp_path / "v.mp4", tmp_path / "a.wav") == tmp_path / "new" / "v_a.mp4"
    with pytest.raises(InputError, match="must end in .mp4"):
        output_path_for(new.rstrip("/"), tmp_path / "v.mp4", tmp_path / "a.wav")
    from nbhelpers.cli.main import main

    loads = []

    def no_load(*args, **kwargs):  # the output was accepted: stop before the models
        loads.append(args)
        raise InputError("stopped before the models")

    monkeypatch.setattr("nbhelpers.cli.avatar.load_avatar", no_load)
    (tmp_path / "avatar").mkdir()
    assert main(["avatar", "generate", str(tmp_path / "avatar"), str(tone_1s), str(tone_1s), "-o", new]) == 2
    assert len(loads) == 1  # two audio files into one folder: not refused as "-o names one file"


def test_every_output_flag_says_it_takes_a_folder():
    from nbhelpers.cli.parser import build_parser

    commands = build_parser()._subparsers._group_actions[0].choices
    helps = {name: " ".join(commands[name].format_help().split()) for name in ("lipsync", "demo")}
    helps["avatar generate"] = " ".join(commands["avatar"]._subparsers._group_actions[0].choices["generate"]
                                        .format_help().split())
    assert "output .mp4, or a folder (existing, or ending in /) to write <video>_<audio>.mp4 into" in helps["lipsync"]
    assert "output .mp4, or a folder (existing, or ending in /) to write the default name into" in helps["demo"]
    assert "or a folder (existing, or ending in /) to write <audio name>.mp4 into" in helps["avatar generate"]


def test_demo_writes_its_default_name_into_an_existing_folder(tmp_path, monkeypatch):
    pytest.importorskip("skimage")
    from nbhelpers import testing
    from nbhelpers.cli.main import main

    written = []

    def job(photo, speech, output, **kwargs):
        written.append(Path(output))
        raise InputError("stopped before the models")

    monkeypatch.setattr("nbhelpers.pipeline.lipsync", job)
    monkeypatch.setattr(testing, "make_tiny_weights", lambda folder, **kw: folder)
    assert main(["demo", "--tiny", "-o", str(tmp_path)]) == 2
    assert main(["demo", "--weights", str(tmp_path), "-o", str(tmp_path)]) == 2
    assert written == [tmp_path / "demo-tiny-noise.mp4", tmp_path / "demo.mp4"]


def test_avatar_generate_writes_each_clip_into_an_existing_folder(tmp_path, tone_1s, lavfi_tone, monkeypatch, capsys):
    from nbhelpers.cli.main import main

    written = []

    class Clip:
        def __init__(self, output):
            self.output = output

        def summary(self):
            return "clip"

    class Loaded:
        def generate(self, audio, output, encoder=None):
            written.append(output)
            return Clip(output)

    monkeypatch.setattr("nbhelpers.cli.avatar.load_avatar", lambda *a, **k: Loaded())
    clips = tmp_path / "clips"
    clips.mkdir()
    other = lavfi_tone(0.5)
    assert main(["avatar", "generate", str(tmp_path), str(tone_1s), str(other), "-o", str(clips)]) == 0
    assert written == [clips / f"{tone_1s.stem}.mp4", clips / f"{other.stem}.mp4"]
    assert main(["avatar", "generate", str(tmp_path), str(tone_1s), str(other), "-o", str(tmp_path / "o.mp4")]) == 2
    assert "give a folder (-o DIR) or leave -o out" in capsys.readouterr().err


def test_avatar_generate_runs_with_the_device_batch_and_compile_given(tmp_path, tone_1s, monkeypatch, capsys):
    """The runtime flags change only those settings of the avatar's; the cached ones (here bbox_shift) stay, and no
    flag loads the avatar with its own settings."""
    from nbhelpers import InferenceConfig
    from nbhelpers.cli.main import main

    stored = InferenceConfig(bbox_shift=5, batch_size=8, compile="auto", fp16=True)
    monkeypatch.setattr("nbhelpers.cli.avatar.read_meta", lambda directory, check: {"params": stored.to_dict()})
    configs = []

    class Loaded:
        def generate(self, audio, output, encoder=None):
            raise SystemExit(0)  # the settings are what this test is about

    monkeypatch.setattr("nbhelpers.cli.avatar.load_avatar", lambda *a, config=None, **k: configs.append(config)
                        or Loaded())
    out = str(tmp_path / "o.mp4")
    for flags in (["--device", "cpu", "--compile", "off", "--batch-size", "4", "--fp32"], []):
        with pytest.raises(SystemExit):
            main(["avatar", "generate", str(tmp_path), str(tone_1s), "-o", out, *flags])
    given, default = configs
    assert (given.device, given.compile, given.batch_size, given.fp16, given.bbox_shift) == ("cpu", "off", 4, False, 5)
    assert default is None
    with pytest.raises(SystemExit):  # "auto" is the automatic default spelt out: nothing given
        main(["avatar", "generate", str(tmp_path), str(tone_1s), "-o", out, "--device", "auto", "--batch-size",
              "automatic"])
    assert configs[2] is None
    assert main(["avatar", "generate", str(tmp_path), str(tone_1s), "-o", out, "--device", "tpu"]) == 2
    assert len(configs) == 3 and "--device" in capsys.readouterr().err


@pytest.mark.parametrize("flags, device, batch_size", [
    (["--device", "auto"], None, None),
    (["--device=auto", "--batch-size", "automatic"], None, None),
    (["--device", "cuda:1", "--batch-size", "8"], "cuda:1", 8),
])
def test_auto_is_the_automatic_default_of_a_job(flags, device, batch_size):
    from nbhelpers.cli.flags import inference_config
    from nbhelpers.cli.parser import build_parser

    config = inference_config(build_parser().parse_args(["lipsync", "v.mp4", "a.wav", *flags]))
    assert (config.device, config.batch_size) == (device, batch_size)


@pytest.mark.parametrize("flags, refused", [
    (["--smooth-boxes", "auto"], "smooth_boxes must be a whole number"),  # its default is 0, not automatic
    (["--device", "AUTO"], "device must be 'cuda'"),  # values are lower case, as 'cpu' and 'cuda' are
])
def test_auto_is_refused_where_it_is_not_the_automatic_default(flags, refused):
    from nbhelpers.cli.flags import inference_config
    from nbhelpers.cli.parser import build_parser

    with pytest.raises(InputError, match=refused):
        inference_config(build_parser().parse_args(["lipsync", "v.mp4", "a.wav", *flags]))


def test_avatar_prepare_takes_no_clip_setting_and_generate_takes_the_uncached_ones(capsys):
    """prepare writes no clip, so an encoder or restorer given to it would do nothing; generate takes exactly the
    settings an avatar does not cache."""
    from nbhelpers import InferenceConfig
    from nbhelpers.avatar.avatar import RUNTIME_FIELDS
    from nbhelpers.cli.parser import build_parser

    parser = build_parser()
    for flag in ("--encoder", "--restore", "--restore-strength"):
        with pytest.raises(SystemExit):
            parser.parse_args(["avatar", "prepare", "v.mp4", "dir", flag, "1"])
        err = capsys.readouterr().err
        assert f"unrecognized arguments: {flag} 1. The encoder and face restorer are chosen per clip: give them to " \
               "`avatar generate`.\n" in err and "Did you mean" not in err, err
    args = parser.parse_args(["avatar", "prepare", "v.mp4", "dir", "--device", "cpu", "--batch-size", "4"])
    assert (args.device, args.batch_size) == ("cpu", 4)
    commands = parser._subparsers._group_actions[0].choices["avatar"]._subparsers._group_actions[0].choices
    taken = {a.dest for a in commands["generate"]._actions} & set(InferenceConfig.__dataclass_fields__)
    assert taken == set(RUNTIME_FIELDS)


def test_the_help_says_auto_where_the_default_is_automatic(capsys):
    from nbhelpers.cli.parser import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["lipsync", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--device DEVICE where the models run: cuda, cuda:N or cpu; automatic: CUDA when available (default: " \
           "automatic, or write auto)" in text
    assert "or write auto" not in text.split("--fp32", 1)[1].split("--", 1)[0]  # a switch has no value to write


def test_an_avatar_loaded_with_a_config_takes_its_compile_mode():
    from pathlib import Path

    from nbhelpers import InferenceConfig
    from nbhelpers.avatar.avatar import stored_config

    meta = {"params": InferenceConfig(bbox_shift=3, compile="auto").to_dict()}
    got = stored_config(meta, InferenceConfig(bbox_shift=3, compile="off", device="cpu"), Path("avatar"))
    assert (got.compile, got.device, got.bbox_shift) == ("off", "cpu", 3)


def test_demo_refuses_an_output_name_before_making_weights(tmp_path, monkeypatch, capsys):
    """``demo -o out.txt --tiny`` is refused before the tiny weights are made (seconds of work) or anything is
    downloaded."""
    from nbhelpers import testing
    from nbhelpers.cli.main import main

    made = []
    monkeypatch.setattr(testing, "make_tiny_weights", lambda folder, **kw: made.append(folder) or folder)
    assert main(["demo", "--tiny", "-o", str(tmp_path / "out.txt")]) == 2
    assert made == [] and "output must end in .mp4 or be an existing folder" in capsys.readouterr().err


def test_avatar_generate_refuses_an_output_name_before_loading_the_avatar(tmp_path, tone_1s, monkeypatch, capsys):
    """``avatar generate DIR a.wav -o out.txt`` is refused before the avatar and its models load."""
    from nbhelpers.cli.main import main

    def no_load(*args, **kwargs):
        raise AssertionError("the avatar loaded before the output name was checked")

    monkeypatch.setattr("nbhelpers.cli.avatar.load_avatar", no_load)
    assert main(["avatar", "generate", str(tmp_path), str(tone_1s), "-o", str(tmp_path / "out.txt")]) == 2
    assert capsys.readouterr().err == (f"error: output must end in .mp4 or be an existing folder; got "
                                       f"{str(tmp_path / 'out.txt')!r}.\n")


@pytest.mark.parametrize("to, refused", [
    ("udp://", "the live output 'udp://' needs a host and a port from 1 to 65535, as in udp://127.0.0.1:9000."),
    ("rtmp:///live/key", "needs a host, as in rtmp://127.0.0.1/live/KEY."),
    ("udp://127.0.0.1", "needs a host and a port"),
    ("udp://:9000", "needs a host and a port"),
    ("udp://127.0.0.1:99999", "needs a host and a port"),
    ("{tmp}/live.avi", "cannot tell the container of"),
])
def test_avatar_live_refuses_an_output_ffmpeg_cannot_open_before_loading(to, refused, tmp_path, tone_1s, monkeypatch,
                                                                         capsys):
    """A --to that ffmpeg would refuse once the models had loaded and frames were sent ('udp://' gave 'Broken
    pipe') is named before the avatar loads."""
    from nbhelpers.cli.main import main
    from nbhelpers.media.stream import container_of

    def no_load(*args, **kwargs):
        raise AssertionError("the avatar loaded before --to was checked")

    monkeypatch.setattr("nbhelpers.cli.avatar.load_avatar", no_load)
    assert main(["avatar", "live", str(tmp_path), "--audio", str(tone_1s), "--to", to.format(tmp=tmp_path)]) == 2
    assert refused in capsys.readouterr().err
    assert [container_of(t) for t in ("udp://127.0.0.1:9000", "srt://:9000?mode=listener", "rtmp://h/app/key",
                                      "x.MKV", "a/b.ts")] == ["mpegts", "mpegts", "flv", "matroska", "mpegts"]
    with pytest.raises(InputError, match="needs a host"):
        container_of("srt://:9000")  # a caller, not a listener, must name whom it calls
